"""The embedded Redis: a private ``redis-server`` per node, started by the node's local rank 0.

Secure by default: a unix socket with mode 0700 inside a fresh 0700 directory with an unguessable
name (``port 0``: no TCP listener at all), or with ``unix_socket=False`` TCP bound to 127.0.0.1
only; a random 256-bit password, written with the rest of the configuration to a file created
exclusively (O_EXCL|O_NOFOLLOW, mode 0600) and never passed on a command line; no persistence
(``save ""``, ``appendonly no``); ``maxmemory`` with an eviction policy. The server gets SIGTERM
when the process that started it dies (PR_SET_PDEATHSIG) and is stopped at exit. The directory of
a process killed before it could remove it (SIGKILL) is removed by the next server this user
starts on the machine (``remove_stale_dirs``).
"""
import atexit
import ctypes
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time

DEFAULT_MAXMEMORY = 0.25   # fraction of the node's available memory
EVICTIONS = ("allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "noeviction")
_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "k": 1 << 10, "mb": 1 << 20, "m": 1 << 20,
          "gb": 1 << 30, "g": 1 << 30, "tb": 1 << 40}


def available_memory():
    """MemAvailable of /proc/meminfo in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    import psutil
    return psutil.virtual_memory().available


def parse_maxmemory(value):
    """None: DEFAULT_MAXMEMORY; a float in (0, 1): that fraction of the available memory; an int or
    a string such as '512mb' / '4gb': bytes. Returns bytes (at least 1 MiB)."""
    if value is None:
        value = DEFAULT_MAXMEMORY
    if isinstance(value, float) and 0 < value < 1:
        return max(int(available_memory() * value), 1 << 20)
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+)\s*([kmgt]?b?)\s*", value.lower())
        if match:
            value = int(match.group(1)) * _UNITS[match.group(2)]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1 << 20:
        return int(value)
    raise ValueError("maxmemory must be a fraction of the free memory (0 < f < 1), a number of "
                     f"bytes >= 1 MiB or a size like '4gb', got {value!r}")


def redis_server_binary():
    path = "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else shutil.which("redis-server")
    if not path:
        raise RuntimeError("redis-server is not installed (Debian package redis-server; make install)")
    return path


_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


class _Launcher:
    """Starts processes from one long-lived thread: PR_SET_PDEATHSIG fires when the *thread* that
    forked the child ends, so children started from a tf.data worker thread must not depend on it."""

    def __init__(self):
        self.requests = queue.Queue()
        threading.Thread(target=self._run, name="datacache-launcher", daemon=True).start()

    def _run(self):
        while True:
            args, kwargs, reply = self.requests.get()
            try:
                reply.put(subprocess.Popen(*args, preexec_fn=_die_with_parent, **kwargs))
            except BaseException as e:   # handed to the caller
                reply.put(e)

    def popen(self, *args, **kwargs):
        reply = queue.Queue(1)
        self.requests.put((args, kwargs, reply))
        result = reply.get()
        if isinstance(result, BaseException):
            raise result
        return result


_launcher = None
_launcher_lock = threading.Lock()


def _popen(*args, **kwargs):
    global _launcher
    with _launcher_lock:
        if _launcher is None:
            _launcher = _Launcher()
    return _launcher.popen(*args, **kwargs)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PREFIX = "datacache-redis-"
_OWNER = "owner"   # "<pid> <start time> <host> <boot id> <pid namespace>" of the process that made it


def _machine():
    """Where a pid means something: host, boot and pid namespace (a temp dir on NFS, or shared by
    containers, holds directories of owners this process cannot see)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        pidns = os.readlink("/proc/self/ns/pid").replace(" ", "_")
    except OSError:
        boot = pidns = "unknown"
    return f"{socket.gethostname()} {boot} {pidns}"


def _start_time(pid):
    """When process pid started (clock ticks after boot), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _answers(sock_path):
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(sock_path)
            return True
        except OSError:
            return False


def remove_stale_dirs(parent=None):
    """Removes this user's server directories in ``parent`` (the temp dir) whose creating process
    is gone and whose socket does not answer; leaves alone a directory without an owner file and
    one made on another host, boot or pid namespace (whose process this one cannot see).
    Returns the removed paths."""
    parent = parent or tempfile.gettempdir()
    removed, here = [], _machine()
    try:
        names = [n for n in os.listdir(parent) if n.startswith(_PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(path, _OWNER), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                pid, start, machine = f.read().rstrip("\n").split(" ", 2)
            pid, start = int(pid), int(start)
        except (OSError, ValueError):
            continue
        if machine != here or _start_time(pid) == start or _answers(os.path.join(path, "redis.sock")):
            continue   # another host's, boot's or pid namespace's, or alive
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


class RedisServer:
    """A private redis-server. ``client_kwargs()`` are the redis.Redis arguments to reach it."""

    def __init__(self, maxmemory=None, eviction="allkeys-lru", unix_socket=True, timeout=10.0):
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {', '.join(EVICTIONS)}, got {eviction!r}")
        self.maxmemory = parse_maxmemory(maxmemory)
        self.binary = redis_server_binary()
        self.timeout = float(timeout)
        remove_stale_dirs()
        self.dir = tempfile.mkdtemp(prefix=_PREFIX)   # 0700, unguessable name
        fd = os.open(os.path.join(self.dir, _OWNER), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()} {_start_time(os.getpid())} {_machine()}\n")
        self.password = secrets.token_hex(32)
        self.socket = os.path.join(self.dir, "redis.sock") if unix_socket else None
        self.port = 0 if unix_socket else _free_port()
        self.conf = os.path.join(self.dir, f"redis-{secrets.token_hex(8)}.conf")
        self.proc = None
        lines = [f"port {self.port}", "bind 127.0.0.1", "protected-mode yes",
                 f"requirepass {self.password}", 'save ""', "appendonly no",
                 f"maxmemory {self.maxmemory}", f"maxmemory-policy {eviction}",
                 f"dir {self.dir}", f"logfile {os.path.join(self.dir, 'redis.log')}",
                 "daemonize no", "databases 1"]
        if self.socket:
            lines += [f"unixsocket {self.socket}", "unixsocketperm 700"]
        fd = os.open(self.conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        atexit.register(self.stop)
        try:
            self.start()
        except BaseException:
            self.stop()
            raise

    def client_kwargs(self):
        where = {"unix_socket_path": self.socket} if self.socket else {"host": "127.0.0.1", "port": self.port}
        return dict(where, password=self.password)

    def url(self, with_password=False):
        """A redis-py URL of the server; with the password only when asked (keep it off logs)."""
        if self.socket:
            return f"unix://{self.socket}" + (f"?password={self.password}" if with_password else "")
        return f"redis://{':' + self.password + '@' if with_password else ''}127.0.0.1:{self.port}"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self):
        """Starts (or restarts, at the same address with the same password) and waits until it answers."""
        import redis

        if self.alive():
            return
        self.proc = _popen([self.binary, self.conf], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + self.timeout
        client = redis.Redis(**self.client_kwargs(), socket_connect_timeout=1, socket_timeout=1)
        while True:
            try:
                client.ping()
                client.close()
                return
            except redis.RedisError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop(remove=False)
                    raise RuntimeError(f"redis-server did not start: {self.log_tail()}") from None
                time.sleep(0.01)

    def log_tail(self, lines=5):
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, remove=True):
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if remove and self.dir and os.path.isdir(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)
            atexit.unregister(self.stop)
