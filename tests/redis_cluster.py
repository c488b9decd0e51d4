"""A real Redis Cluster of three masters (no replicas) on 127.0.0.1, for the DataCache tests.

Each master runs in its own temp dir from a 0600 config file (the password is on no command line:
redis-cli gets it through REDISCLI_AUTH), without persistence, and is stopped by ``stop()`` (also
the ones a test killed). Every wait is bounded and fails with a message that says what it waited for.
"""
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import redis

HOST = "127.0.0.1"


def _free(port):
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_ports(count, lo=20000, hi=50000):
    """``count`` ports P that are free, each with its cluster bus port P + 10000 free too."""
    rng = secrets.SystemRandom()
    ports = []
    for _ in range(1000):
        p = rng.randrange(lo, hi)
        if p not in ports and _free(p) and _free(p + 10000):
            ports.append(p)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"found no {count} free port pairs in [{lo}, {hi})")


def wait_until(predicate, timeout, what, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class RedisCluster:
    def __init__(self, masters=3, full_coverage=True):
        """full_coverage: Redis's cluster-require-full-coverage (its default, yes: once a master is
        marked failed, every master refuses every command with CLUSTERDOWN; no: the others serve
        their slots)."""
        self.full_coverage = full_coverage
        self.password = secrets.token_hex(16)
        self.ports = []
        self.dirs = []
        self.procs = []
        self.killed_slots = {}
        self.masters = masters

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, timeout=30):
        self.ports = free_ports(self.masters)
        for port in self.ports:
            d = tempfile.mkdtemp(prefix=f"dc-cluster-{port}-")
            self.dirs.append(d)
            conf = os.path.join(d, "redis.conf")
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"bind {HOST}\nport {port}\nprotected-mode yes\ndir {d}\n"
                        f"cluster-enabled yes\ncluster-config-file {d}/nodes.conf\n"
                        f"cluster-node-timeout 2000\nrequirepass {self.password}\n"
                        f"masterauth {self.password}\nsave \"\"\nappendonly no\n"
                        f"logfile {d}/redis.log\n"
                        f"cluster-require-full-coverage {'yes' if self.full_coverage else 'no'}\n")
            self.procs.append(subprocess.Popen(["redis-server", conf], cwd=d, stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for i in range(self.masters):
            wait_until(lambda i=i: self._pings(i), timeout, f"redis-server on port {self.ports[i]} "
                       f"(log: {self.dirs[i]}/redis.log)")
        out = self.cli("--cluster", "create", *(f"{HOST}:{p}" for p in self.ports), "--cluster-yes",
                       timeout=timeout)
        assert "[OK] All 16384 slots covered" in out, f"redis-cli --cluster create:\n{out}"
        self.wait_ok(timeout=timeout)
        return self

    def stop(self, timeout=10):
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()

    # -- helpers ----------------------------------------------------------------------------------
    def url(self, i=0):
        return f"redis://:{self.password}@{HOST}:{self.ports[i]}"

    def client(self, i):
        return redis.Redis(host=HOST, port=self.ports[i], password=self.password, socket_timeout=5,
                           socket_connect_timeout=2, retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))

    def _pings(self, i):
        try:
            with self.client(i) as c:
                return c.ping()
        except redis.RedisError:
            return False

    def cli(self, *args, timeout=60):
        """redis-cli with the password in REDISCLI_AUTH; its output (stdout and stderr)."""
        env = dict(os.environ, REDISCLI_AUTH=self.password)
        p = subprocess.run(["redis-cli", *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=timeout)
        out = p.stdout + p.stderr
        assert p.returncode == 0, f"redis-cli {' '.join(args)} exited with {p.returncode}:\n{out}"
        return out

    def alive(self):
        return [i for i, p in enumerate(self.procs) if p.poll() is None]

    def wait_ok(self, nodes=None, timeout=30):
        """Every node of ``nodes`` (default: the live ones) reports cluster_state:ok and one
        config, with every slot assigned (no node still importing or migrating)."""
        nodes = self.alive() if nodes is None else nodes

        def ok():
            try:
                for i in nodes:
                    with self.client(i) as c:
                        info = c.cluster("info")
                        if info.get("cluster_state") != "ok" or int(info.get("cluster_slots_assigned", 0)) != 16384:
                            return False
                return True
            except redis.RedisError:
                return False
        wait_until(ok, timeout, f"cluster_state:ok on ports {[self.ports[i] for i in nodes]}", interval=0.1)

    def node_id(self, i):
        with self.client(i) as c:
            return c.execute_command("CLUSTER", "MYID").decode()

    def slots(self, i):
        """The slots master i serves, as its own CLUSTER NODES line says."""
        with self.client(i) as c:
            lines = c.execute_command("CLUSTER", "NODES").decode().splitlines()
        mine = next(line for line in lines if "myself" in line.split()[2])
        out = set()
        for part in mine.split()[8:]:
            if part.startswith("["):   # a slot being migrated or imported
                continue
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
        return out

    def kill(self, i):
        """SIGKILL master i (its slots stay unserved: there is no replica to take over)."""
        self.killed_slots[i] = self.slots(i)
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(10)

    def reshard(self, src, dst, count, timeout=120):
        """Moves ``count`` slots (and their keys) from master src to master dst."""
        return self.cli("--cluster", "reshard", f"{HOST}:{self.ports[src]}", "--cluster-from",
                        self.node_id(src), "--cluster-to", self.node_id(dst), "--cluster-slots", str(count),
                        "--cluster-yes", timeout=timeout)

    def wait_failed(self, i, timeout=30):
        """The live masters mark master i failed (after cluster-node-timeout, 2 s here)."""
        def marked():
            try:
                for j in self.alive():
                    with self.client(j) as c:
                        if int(c.cluster("info").get("cluster_slots_fail", 0)) != len(self.killed_slots[i]):
                            return False
                return True
            except redis.RedisError:
                return False
        wait_until(marked, timeout, f"the live masters to mark master {i} (port {self.ports[i]}) failed",
                   interval=0.1)

    def keys(self, i, match="*"):
        """The keys that master i holds."""
        with self.client(i) as c:
            return set(c.scan_iter(match=match, count=1000))
