"""DataCache's embedded redis-server: private (its directory, config and socket, its password,
TCP on 127.0.0.1 only), stopped and removed with its cache, and the directory of a killed owner
removed by the next server."""
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid

import pytest
import redis

from datacache import DataCache, DecodeResize, RedisServer, cached_dataset
from datacache.server import remove_stale_dirs


def bare(**kwargs):
    """A client that does not retry (a refused login would be retried for seconds)."""
    return redis.Redis(retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0), **kwargs)


def test_embedded_server_is_private(source):
    with DataCache(progress=False) as cache:
        cached_dataset(source, DecodeResize(16), cache)
        server = cache.server
        assert stat.S_IMODE(os.stat(server.dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(server.conf).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(server.socket).st_mode) & 0o077 == 0
        with open(f"/proc/{server.proc.pid}/cmdline", "rb") as f:
            assert server.password.encode() not in f.read()
        with pytest.raises(redis.AuthenticationError):
            bare(unix_socket_path=server.socket).ping()
        with pytest.raises(redis.AuthenticationError):
            bare(unix_socket_path=server.socket, password="guess").ping()
        cfg = cache.redis.config_get("*")
        assert cfg["port"] == "0" and cfg["save"] == "" and cfg["appendonly"] == "no"
        assert cfg["maxmemory-policy"] == "allkeys-lru" and int(cfg["maxmemory"]) == server.maxmemory > 0
        pid, where = server.proc.pid, server.dir
    assert not os.path.exists(where)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    import psutil
    with DataCache(unix_socket=False, progress=False) as cache:
        listening = [c.laddr for c in psutil.Process(cache.server.proc.pid).net_connections()
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(a.ip == "127.0.0.1" for a in listening)
        assert bare(port=cache.server.port, password=cache.server.password).ping()
        with pytest.raises(redis.AuthenticationError):
            bare(port=cache.server.port).ping()


def test_directory_of_a_killed_owner_is_removed_by_the_next_server():
    """A process killed with SIGKILL cannot remove its server's directory (its redis-server dies
    with it); the next RedisServer of this user removes it, and leaves the directories of live
    owners, those without an owner file and those of another host (a shared temp dir) alone."""
    parent = tempfile.mkdtemp(prefix="dc-stale-")   # short: unix socket paths are <= 107 bytes
    try:
        code = ("import datacache, sys; s = datacache.RedisServer(maxmemory='16mb'); "
                "print(s.dir, s.proc.pid, flush=True); sys.stdin.read()")
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=dict(os.environ, TMPDIR=parent))
        dead_dir, redis_pid = child.stdout.readline().split()
        live = RedisServer(maxmemory="16mb")   # in the default temp dir: must not be touched
        other = os.path.join(parent, "datacache-redis-noowner")
        os.mkdir(other, 0o700)
        elsewhere = os.path.join(parent, "datacache-redis-elsewhere")   # a dead pid, on another host
        os.mkdir(elsewhere, 0o700)
        with open(os.path.join(elsewhere, "owner"), "w") as f:
            f.write(f"{2**22 + 1} 1 other-host {uuid.uuid4()} pid:[1]\n")
        try:
            assert remove_stale_dirs(parent) == []   # the owner is alive
            child.kill()
            child.wait()
            deadline = time.monotonic() + 10
            while os.path.exists(f"/proc/{redis_pid}") and time.monotonic() < deadline:
                time.sleep(0.05)   # the server got SIGTERM when its parent died
            assert os.path.isdir(dead_dir)
            assert remove_stale_dirs(parent) == [dead_dir]
            assert not os.path.exists(dead_dir) and os.path.isdir(other) and os.path.isdir(elsewhere)
            assert live.alive() and os.path.isdir(live.dir)
            assert live.dir not in remove_stale_dirs()
        finally:
            live.stop()
    finally:
        shutil.rmtree(parent, ignore_errors=True)
