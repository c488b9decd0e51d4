"""The parts of the fault benchmark (tfc_apps.bench.faults) that watch a job and inject faults:
when its ranks die, what a job left behind (processes, /dev/shm, Redis), a node's inter-node link
cut in its network namespace, a rank's checkpoint directory on a tmpfs that fills up (or a file
size limit on the rank), the embedded redis-server of a node."""
import json
import os
import shutil
import signal
import subprocess
import threading
import time

import psutil

from tfc_apps import local_run

MARK = "TF_COMMLIB_FAULT_RUN"   # in the environment of every process of a job (ranks, their redis-server)
SHM = "/dev/shm"


def _env(p):
    try:
        return p.environ()
    except psutil.Error:
        return {}


def _gone(p):
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


class Watcher:
    """Polls the ranks of job proc (local_run.ranks_of, without the servers they start) and notes
    when each was first seen gone: first_death is when the first rank died (time.time())."""

    def __init__(self, proc, period=0.05):
        self.proc, self.period = proc, period
        self.ranks, self.died = {}, {}   # pid -> (Process, HOROVOD_RANK); pid -> time seen gone
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            for p in local_run.ranks_of(self.proc):
                if p.pid not in self.ranks and "redis" not in _name(p):
                    self.ranks[p.pid] = (p, _env(p).get(local_run.RANK_VAR))
            now = time.time()
            for pid, (p, _) in list(self.ranks.items()):
                if pid not in self.died and _gone(p):
                    self.died[pid] = now
            if self.proc.poll() is not None:
                break
            self._stop.wait(self.period)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)
        now = time.time()
        for pid, (p, _) in self.ranks.items():
            self.died.setdefault(pid, now)

    def pid_of(self, rank):
        return next((pid for pid, (p, r) in self.ranks.items() if r == str(rank) and pid not in self.died), None)

    @property
    def first_death(self):
        return min(self.died.values()) if self.died else None


def _name(p):
    try:
        return p.name()
    except psutil.Error:
        return ""


def shm_names():
    try:
        return set(os.listdir(SHM))
    except OSError:
        return set()


def shm_in_use():
    """The /dev/shm names some live process has mapped or open (after a job's processes are dead,
    those belong to other jobs on the machine, not to its leftovers)."""
    used = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    at = line.find(SHM + "/")
                    if at >= 0:
                        used.add(line[at + len(SHM) + 1:].split()[0])
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(SHM + "/"):
                    used.add(target[len(SHM) + 1:].split()[0])
        except OSError:
            continue
    return used


def _owner(p):
    """The pid that made an embedded redis-server's directory (datacache/server.py's owner file,
    in the server's working directory), or None. redis-server overwrites its command line and
    environment with its title, so neither MARK nor the configuration file can be read there."""
    try:
        with open(os.path.join(p.cwd(), "owner")) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def _job_servers(run_id, rank_pids):
    """The redis-servers of job run_id: started by one of its ranks (their parent carries MARK) or
    made by one of rank_pids (a server its rank's death left behind)."""
    found = []
    for p in psutil.process_iter():
        if "redis" not in _name(p):
            continue
        try:
            parent = p.parent()
        except psutil.Error:
            continue
        if (parent is not None and _env(parent).get(MARK) == run_id) or _owner(p) in rank_pids:
            found.append(p)
    return found


def left_over(run_id, shm_before, rank_pids=()):
    """What job run_id left on this machine: its processes (MARK in their environment) and
    redis-servers (_job_servers), killed after being counted, with the keys those servers held;
    embedded-Redis directories made by rank_pids; the names new in /dev/shm that no live process has
    mapped or open (tf_commlib's tfcl_* segments and multiprocessing's sem.mp-* semaphores among them are
    removed after being counted)."""
    import tempfile

    servers = _job_servers(run_id, set(rank_pids))
    procs = [p for p in psutil.process_iter() if _env(p).get(MARK) == run_id and p not in servers] + servers
    keys = sum(_redis_keys(p) for p in servers)
    names = sorted(_name(p) or "?" for p in procs)
    for p in procs:
        kill(p)
    dirs = []
    parent = tempfile.gettempdir()
    for name in os.listdir(parent):
        path = os.path.join(parent, name, "owner")
        if name.startswith("datacache-redis-") and os.path.exists(path):
            try:
                if int(open(path).read().split()[0]) in set(rank_pids):
                    dirs.append(name)
                    if not psutil.pid_exists(int(open(path).read().split()[0])):   # its owner is gone
                        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            except (OSError, ValueError, IndexError):
                pass
    new_shm = sorted(shm_names() - shm_before - shm_in_use())   # a live process's: another job's
    for name in new_shm:
        if name.startswith(("tfcl_", "sem.mp-")):
            try:
                os.unlink(os.path.join(SHM, name))
            except OSError:
                pass
    return {"processes_left": names, "shm_left": new_shm, "redis_servers_left": len(servers),
            "redis_keys_left": keys, "redis_dirs_left": dirs}


def redis_client(p):
    """A redis-py client of embedded redis-server p (its address and password are in the
    configuration file in its working directory), or None when it cannot be read."""
    try:
        import glob

        import redis

        conf = glob.glob(os.path.join(p.cwd(), "redis-*.conf"))[0]
        settings = dict(line.split(" ", 1) for line in open(conf).read().splitlines() if " " in line)
        where = ({"unix_socket_path": settings["unixsocket"]} if "unixsocket" in settings
                 else {"host": "127.0.0.1", "port": int(settings["port"])})
        return redis.Redis(**where, password=settings["requirepass"], socket_timeout=2)
    except Exception:
        return None


def _redis_keys(p):
    """DBSIZE of a left-over embedded redis-server; -1 when it cannot be asked."""
    try:
        return int(redis_client(p).dbsize())
    except Exception:
        return -1


def redis_reads(client):
    """(keys held, keys read so far, of them hits) of a server: keyspace hits + misses; or None."""
    try:
        stats = client.info("stats")
        hits = int(stats["keyspace_hits"])
        return int(client.dbsize()), hits + int(stats["keyspace_misses"]), hits
    except Exception:
        return None


def saved_epochs(ckpt_dir, ranks):
    """The epoch each rank's BackupAndRestore backup ends at (0 without one)."""
    epochs = []
    for r in range(ranks):
        try:
            with open(os.path.join(ckpt_dir, f"rank{r}", "training_metadata.json")) as f:
                epochs.append(int(json.load(f)["epoch"]))
        except (OSError, ValueError, KeyError):
            epochs.append(0)
    return epochs


def wait_for(condition, proc, timeout, period=0.05):
    """Polls condition() until it holds (True) or job proc ends or timeout passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            return True
        time.sleep(period)
    return False


# -- faults -------------------------------------------------------------------------------------
def node_link(node):
    """(namespace, interface) of node's end of its inter-node link, from the state file that
    scripts/emulate_cluster.sh wrote (only what it created is touched)."""
    from tfc_apps.cluster_launch import STATE, read_state

    st = read_state(STATE)
    ns, iface = st[f"NODE{node}_NS"], st[f"NODE{node}_IFACE"]
    if not (ns.startswith("tfc-node") and iface.startswith("tfc-n")):
        raise RuntimeError(f"{STATE} names {ns}/{iface}, not a namespace emulate_cluster.sh made")
    return ns, iface


def set_link(ns, iface, up):
    subprocess.run(["ip", "-n", ns, "link", "set", iface, "up" if up else "down"], check=True,
                   capture_output=True, text=True)


def link_is_up(ns, iface):
    out = subprocess.run(["ip", "-n", ns, "-br", "link", "show", iface], capture_output=True, text=True).stdout
    return " UP " in f" {out} " or "UNKNOWN" in out


def redis_servers(run_id, node):
    """The embedded redis-servers that the ranks of node (HOROVOD_CROSS_RANK) of job run_id started."""
    found = []
    for p in psutil.process_iter():
        if "redis" not in _name(p):
            continue
        try:
            env = _env(p.parent())
        except (psutil.Error, AttributeError):
            continue
        if env.get(MARK) == run_id and env.get("HOROVOD_CROSS_RANK") == str(node):
            found.append(p)
    return found


class Tmpfs:
    """A tmpfs mounted at path (root), its size cut to what it holds by fill(): the next write
    that needs a page more gets ENOSPC. Unmounted (contents moved into path) by release()."""

    def __init__(self, path, size="64m"):
        self.path = path
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tfc-faults", path],
                       check=True, capture_output=True, text=True)
        self.mounted = True

    def used(self):
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def fill(self):
        """Shrinks the file system to its used size plus one page; returns that size."""
        size = self.used() + 4096
        subprocess.run(["mount", "-o", f"remount,size={size}", self.path], check=True, capture_output=True,
                       text=True)
        return size

    def release(self):
        """Copies the contents out, unmounts, puts them back in the (now ordinary) directory."""
        if not self.mounted:
            return
        keep = self.path.rstrip("/") + ".freed"
        os.makedirs(keep, exist_ok=True)
        subprocess.run(["cp", "-a", self.path + "/.", keep], capture_output=True)
        subprocess.run(["umount", self.path], check=True, capture_output=True, text=True)
        self.mounted = False
        subprocess.run(["cp", "-a", keep + "/.", self.path], check=True, capture_output=True)
        subprocess.run(["rm", "-rf", keep], capture_output=True)


def limit_file_size(pid, nbytes):
    """RLIMIT_FSIZE of process pid (what a rank without root gets instead of a full tmpfs: a
    write past nbytes fails with EFBIG; Python ignores SIGXFSZ)."""
    psutil.Process(pid).rlimit(psutil.RLIMIT_FSIZE, (nbytes, nbytes))


def kill(p, sig=signal.SIGKILL):
    try:
        p.send_signal(sig)
        return True
    except psutil.Error:
        return False
