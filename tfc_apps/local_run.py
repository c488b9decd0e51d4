"""Starts and stops the jobs of tf_commlib: `python ARGS...` on N local ranks under ``horovodrun
--gloo``, through a launcher that starts the ranks itself (tfc_apps.cluster_launch, as
tfc_apps.emulated gives it), or as one plain process; the only place a horovodrun command line is
assembled. A job runs in its own process group; past its timeout, on an error or on Ctrl-C while
waiting, its ranks are killed the way a node failure kills them (kill_ranks), so nothing is left.
Used by the applications (tfc_apps.demo, the benchmarks), the tests (tests/hvdrun.py) and, for
stopping its ranks, tfc_apps.cluster_launch. Also the training summaries shared by tfc_apps.demo
and the convergence benchmark (table, plot)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]   # put first on the ranks' PYTHONPATH
RANK_VAR = "HOROVOD_RANK"   # set in the environment of every rank (horovodrun, cluster_launch, tfc_apps.slurm)


class JobFailed(RuntimeError):
    """A job exited non-zero (returncode) or was killed; log is its output (captured jobs)."""

    def __init__(self, message, returncode=None, log=""):
        super().__init__(message)
        self.returncode, self.log = returncode, log


class JobTimeout(JobFailed):
    """A job ran past its timeout; its ranks were killed."""


def cluster_launch_prefix(local=None, np_per_node=None, timeout=None):
    """The command prefix that starts a command as the ranks of the emulated cluster
    (tfc_apps.cluster_launch), or with ``local=M`` as M nodes on 127.0.0.1."""
    return [sys.executable, "-m", "tfc_apps.cluster_launch",
            *(["--local", str(local)] if local else []),
            *(["--np-per-node", str(np_per_node)] if np_per_node else []),
            *(["--timeout", str(timeout)] if timeout else []), "--"]


def command(argv, np_=None, launcher=None):
    """The job's command line: ``python argv...`` under `launcher` (a command prefix), else on np_
    local ranks under horovodrun (Gloo; tfc_apps.horovodrun, which skips Horovod's per-launch build
    probe), else (np_=None) alone."""
    if launcher is None and np_ is not None:
        launcher = [sys.executable, "-m", "tfc_apps.horovodrun", "-np", str(np_), "-H", f"localhost:{np_}", "--gloo"]
    return [*(launcher or []), sys.executable, *map(str, argv)]


def job_env(topology=None, env=None):
    """The job's environment: this process's, with the repository first on PYTHONPATH (the ranks run
    this checkout's code, `-m tests.workers.x` included), TensorFlow's C++ logs quiet,
    TF_COMMLIB_TOPOLOGY set to `topology` (removed when None), then `env` on top."""
    path = [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT))]
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(path), TF_CPP_MIN_LOG_LEVEL="2")
    full.pop("TF_COMMLIB_TOPOLOGY", None)
    if topology:
        full["TF_COMMLIB_TOPOLOGY"] = topology
    full.update(env or {})
    return full


def start(argv, np_=None, *, launcher=None, topology=None, env=None, capture=True, cwd=None):
    """Starts the job ``command(argv, np_, launcher)`` in its own process group (session) with
    ``job_env(topology, env)``; its stdout and stderr go to one pipe (capture) or to this process's.
    Returns the Popen; wait() or kill_ranks() it."""
    return subprocess.Popen(command(argv, np_, launcher), env=job_env(topology, env), cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if capture else None,
                            stderr=subprocess.STDOUT if capture else None, start_new_session=True, text=True)


def signal_group(pid, sig):
    """Sends sig to process group pid; False when there is none."""
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        return False


def stop_groups(procs, sig=signal.SIGTERM, grace=3.0):
    """Signals the process group of each of procs that is still running (each started with
    start_new_session); after `grace` seconds SIGKILLs what is left; reaps them all."""
    for p in procs:
        if p.poll() is None:
            signal_group(p.pid, sig)
    deadline = time.monotonic() + grace
    while sig != signal.SIGKILL and any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            return stop_groups(procs, signal.SIGKILL)
        time.sleep(0.05)
    for p in procs:
        p.wait()


def ranks_of(proc):
    """The processes of proc's job that are ranks (or started by one): its descendants with
    HOROVOD_RANK in their environment."""
    import psutil

    found = []
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        return found
    for child in children:
        try:
            if RANK_VAR in child.environ():
                found.append(child)
        except psutil.Error:
            pass
    return found


def kill_ranks(proc):
    """Stops the job proc (from start()): SIGKILLs its ranks (as a node failure would) and lets the
    launcher (horovodrun, cluster_launch) see them die and exit, so that its multiprocessing
    resource tracker unlinks the job's named semaphores (SIGKILL of the whole process group left 5
    /dev/shm/sem.mp-* per rank behind); then SIGKILLs what is left of its process group. Returns
    proc's output (captured jobs; else "")."""
    import psutil

    log = None
    try:
        ranks = ranks_of(proc)
        for rank in ranks:
            try:
                rank.kill()
            except psutil.Error:
                pass
        if ranks:   # a plain process (no ranks) is killed with its group below
            log = proc.communicate(timeout=60)[0]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and signal_group(proc.pid, 0):   # the tracker unlinks, exits
                time.sleep(0.1)
    except subprocess.TimeoutExpired:
        pass
    finally:
        signal_group(proc.pid, signal.SIGKILL)
        if log is None:
            log = proc.communicate()[0]
    return log or ""


def wait(proc, timeout=None):
    """proc's output (captured jobs; else "") once it exits. Past `timeout` seconds its ranks are
    killed (kill_ranks) and JobTimeout raised; on any other exception while waiting (Ctrl-C) they
    are killed and the exception goes on."""
    try:
        return proc.communicate(timeout=timeout)[0] or ""
    except subprocess.TimeoutExpired:
        log = kill_ranks(proc)
        raise JobTimeout(f"{' '.join(proc.args[-4:])} timed out after {timeout}s; its ranks were killed:\n"
                         f"{log[-4000:]}", proc.returncode, log) from None
    except BaseException:
        kill_ranks(proc)
        raise


def run(argv, np_=None, *, launcher=None, topology=None, env=None, timeout=None, capture=True, cwd=None,
        check=True, echo=False):
    """Runs the job ``python argv...`` (see start) to its end, its ranks killed past `timeout`
    seconds (JobTimeout) or on an error; returns (exit status, output). With `check`, a non-zero
    exit raises JobFailed; `echo` prints the command line first."""
    proc = start(argv, np_, launcher=launcher, topology=topology, env=env, capture=capture, cwd=cwd)
    if echo:
        print("$", " ".join(proc.args), flush=True)
    log = wait(proc, timeout)
    if check and proc.returncode:
        raise JobFailed(f"{' '.join(map(str, argv[:3]))} failed (exit {proc.returncode}):\n{log[-6000:]}",
                        proc.returncode, log)
    return proc.returncode, log


def horovodrun(np_, module, *args, topology="2x2", launcher=None, timeout=None):
    """Runs `python -m module args` on np_ local ranks (or through `launcher`, a command prefix
    such as tfc_apps.emulated's); prints rank 0's output; raises on failure."""
    rc, log = run(["-m", module, *args], np_, launcher=launcher, topology=topology, timeout=timeout,
                  check=False, echo=True)
    for line in log.splitlines():  # rank 0's output, without Horovod's prefix
        if line.startswith("[0]<stdout>:"):
            print(line[len("[0]<stdout>:"):], flush=True)
    if rc:
        print(log[-3000:], file=sys.stderr)
        raise SystemExit(f"{module} failed with exit code {rc}")


def train(np_, out_dir, name, *args, topology="2x2", launcher=None):
    """Runs tfc_apps.train and returns its summary (written by rank 0)."""
    summary = Path(out_dir) / f"{name}.json"
    horovodrun(np_, "tfc_apps.train", *args, "--json", str(summary), topology=topology, launcher=launcher)
    run = json.loads(summary.read_text())
    run["label"] = name
    return run


def median_rate(run):
    """Median samples/s over the second half of the epochs (after tracing and DGC's density warm-up)."""
    rates = sorted(r["samples_per_s"] for r in run["epochs"][len(run["epochs"]) // 2:])
    return rates[len(rates) // 2]


def summary_table(runs):
    """Final and best accuracy, median samples/s over the second half of the epochs and the last
    epoch's kB a rank sends per step inside its node and between nodes."""
    lines = [f"{'run':26s} {'final test acc':>14s} {'best':>6s} {'samples/s':>10s} "
             f"{'intra kB/step':>13s} {'inter kB/step':>13s}"]
    for run in runs:
        e = run["epochs"]
        lines.append(f"{run['label']:26s} {e[-1]['test_accuracy']:14.4f} "
                     f"{max(r['test_accuracy'] for r in e):6.4f} {median_rate(run):10.1f} "
                     f"{e[-1]['intra_bytes_per_step'] / 1e3:13.1f} {e[-1]['inter_bytes_per_step'] / 1e3:13.1f}")
    return "\n".join(lines)


def plot_accuracy(runs, title, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        ax.plot([r["epoch"] for r in run["epochs"]], [r["test_accuracy"] for r in run["epochs"]],
                marker="o", label=run["label"])
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
