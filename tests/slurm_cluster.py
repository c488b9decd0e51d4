"""A real Slurm on this machine (Debian's slurmctld/slurmd 22.05 and munge, two nodes) for tests/test_slurm*.py.

start() writes slurm.conf into a temporary directory (free ports, state and spool there), starts
munged (unless one runs already), slurmctld and one slurmd per node, and waits for the nodes to be
idle; stop() cancels what is left and stops the daemons it started by their PID files.
Machine-wide: callers hold /tmp/tf_commlib_slurm.lock. The machine holds NODES nodes (tfc1, tfc2:
slurmd -N, Debian builds Slurm with multiple-slurmd support) at 127.0.0.1, so that a job can span two
nodes; each declares at least 4 CPUs (SlurmdParameters=config_overrides) so that
`--ntasks-per-node=4` jobs fit on a 2-core machine; jobs use --overcommit.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

LOCK = "/tmp/tf_commlib_slurm.lock"
NODES = ("tfc1", "tfc2")
MUNGE_PID = Path("/run/munge/munged.pid")
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
        "BOOT_FAIL", "DEADLINE"}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid_file):
    try:
        os.kill(int(Path(pid_file).read_text().split()[0]), 0)
        return True
    except (OSError, ValueError, IndexError):
        return False


def _stop(pid_file, timeout=15):
    """SIGTERM to the daemon in pid_file, SIGKILL if it is still there after `timeout` seconds."""
    try:
        pid = int(Path(pid_file).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


class SlurmCluster:
    def __init__(self, workdir):
        self.dir = Path(workdir)
        self.conf = self.dir / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.started_munge = False

    def _write_conf(self):
        host = socket.gethostname().split(".")[0]
        for sub in ("state", *(f"spool/{node}" for node in NODES)):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        d = self.dir
        self.conf.write_text(f"""\
ClusterName=tfcltest
SlurmctldHost={host}
SlurmUser=root
AuthType=auth/munge
SlurmctldPort={_free_port()}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=10
""" + "".join(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} "
              f"CPUs={max(4, os.cpu_count())} State=UNKNOWN\n" for node in NODES) + """\
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")

    def start(self):
        missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol") if not shutil.which(b)]
        if missing:
            raise RuntimeError(f"{missing} not installed: `make install` (scripts/install_apt.sh) installs "
                               "slurmctld slurmd slurm-client munge libpmix2")
        self._write_conf()
        if not _alive(MUNGE_PID):
            subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "755", "/run/munge"], check=True)
            subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
            self.started_munge = True
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, env=self.env)
        for node in NODES:
            subprocess.run(["slurmd", "-f", str(self.conf), "-N", node], check=True, env=self.env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split()
            if out == ["idle"] * len(NODES):
                return
            time.sleep(0.3)
        raise RuntimeError(f"the Slurm nodes are not idle after 60 s (sinfo: {out!r}):\n" + self.logs())

    def logs(self):
        return "\n".join(f"--- {p.name}\n" + p.read_text()[-3000:] for p in sorted(self.dir.glob("*.log")))

    def stop(self):
        if (self.dir / "slurmctld.pid").exists():
            self.run("scancel", "--user", "root", check=False)
        deadline = time.monotonic() + 30   # jobs end (the node's processes too) before slurmd stops
        while time.monotonic() < deadline and self.run("squeue", "-h", check=False).stdout.strip():
            time.sleep(0.3)
        for node in NODES:
            _stop(self.dir / f"slurmd.{node}.pid")
        _stop(self.dir / "slurmctld.pid")
        if self.started_munge:
            _stop(MUNGE_PID)

    def run(self, *cmd, check=True):
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, check=check, timeout=60)

    def submit(self, script, *args, sbatch=(), env=None, chdir):
        """sbatch [sbatch options] script args; returns the job id."""
        out = subprocess.run(["sbatch", "--parsable", f"--chdir={chdir}", f"--output={chdir}/job.out",
                              *sbatch, str(script), *map(str, args)], capture_output=True, text=True,
                             env=dict(self.env, **(env or {})), timeout=60)
        if out.returncode:
            raise RuntimeError(f"sbatch failed: {out.stderr}")
        return out.stdout.strip().split(";")[0]

    def job(self, job_id):
        """`scontrol show job` as a dict (JobState, ExitCode, Restarts...)."""
        text = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id, until=DONE, timeout=900):
        """Polls scontrol until the job's state is in `until` (sbatch --wait polls too slowly). The
        timeout only catches hangs: a 3-epoch job takes ~1 min on 2 idle cores, >5 on a busy one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in until:
                return info
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} not {until} after {timeout} s: {self.job(job_id)}")


def job_processes(job_id):
    """PIDs of processes that run for the job (SLURM_JOB_ID=<id> in their environment)."""
    key = f"SLURM_JOB_ID={job_id}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if key in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def leftovers(job_id, timeout=20):
    """What the job left on this machine once it ended: processes and /dev/shm files. Processes get
    `timeout` seconds to go (Slurm's KillWait is 10 s)."""
    deadline = time.monotonic() + timeout
    while job_processes(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {"processes": job_processes(job_id), "shm": sorted(p.name for p in Path("/dev/shm").glob(f"tfcl_j{job_id}s*"))}
