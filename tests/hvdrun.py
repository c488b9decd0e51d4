"""Runs a worker script on N local ranks with horovodrun (Gloo) and collects each rank's JSON.

A worker calls ``report(obj)`` to write ``rank<R>.json`` into $HVD_TEST_OUT. A run that exceeds its
timeout has its ranks killed (then anything left in its process group) and fails the test; it never hangs CI.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


def kill_ranks(proc, script):
    """SIGKILLs the ranks (as a node failure would) and lets horovodrun see them die and exit, so
    that its multiprocessing resource tracker unlinks the job's named semaphores (SIGKILL of the
    whole process group left 5 /dev/shm/sem.mp-* per rank behind); then kills what is left.
    Returns proc's output."""
    log = None
    try:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if script in " ".join(child.cmdline()):
                    child.kill()
            except psutil.Error:
                pass
        log = proc.communicate(timeout=60)[0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:   # the resource tracker unlinks, then exits
            os.killpg(proc.pid, 0)
            time.sleep(0.1)
    except (psutil.Error, subprocess.TimeoutExpired, ProcessLookupError):
        pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if log is None:
            log = proc.communicate()[0]
    return log


def output(proc, timeout, what):
    """proc's output once it exits; past the timeout its ranks are killed and the test fails."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        log = kill_ranks(proc, str(ROOT))
        raise AssertionError(f"{what} timed out after {timeout}s:\n{log[-4000:]}")


def launch(argv, np_, topology=None, env=None):
    """Starts ``python argv...`` on np_ local ranks under horovodrun (Gloo), in its own process
    group, output (stdout and stderr) in a pipe; np_=None runs it as one plain process."""
    horovodrun = Path(sys.executable).parent / "horovodrun"
    prefix = [] if np_ is None else [str(horovodrun), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo"]
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    full_env.pop("TF_COMMLIB_TOPOLOGY", None)
    if topology:
        full_env["TF_COMMLIB_TOPOLOGY"] = topology
    full_env.update(env or {})
    return subprocess.Popen(prefix + [sys.executable, *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=full_env, start_new_session=True, text=True)


def run_command(argv, np_, timeout, topology=None, env=None):
    """Runs ``launch(argv, np_, ...)`` to its end; returns its output; fails the test if it times out
    (its ranks killed) or exits non-zero."""
    proc = launch(argv, np_, topology, env)
    what = " ".join(map(str, argv[:3]))
    log = output(proc, timeout, what)
    assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{log[-6000:]}"
    return log


def run(worker, np_, tmp_path, args=(), topology=None, timeout=240, env=None, expect_fail=False):
    """Runs tests/workers/<worker> on np_ ranks; returns the list of per-rank reports (rank order)."""
    out = Path(tmp_path) / f"hvd_{worker.replace('.py', '')}"
    out.mkdir(parents=True, exist_ok=True)
    horovodrun = Path(sys.executable).parent / "horovodrun"
    cmd = [str(horovodrun), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo",
           sys.executable, str(WORKERS / worker), *map(str, args)]
    full_env = dict(os.environ, HVD_TEST_OUT=str(out), PYTHONPATH=str(ROOT),
                    TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    full_env.pop("TF_COMMLIB_TOPOLOGY", None)
    if topology:
        full_env["TF_COMMLIB_TOPOLOGY"] = topology
    full_env.update(env or {})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env,
                            start_new_session=True, text=True)
    log = output(proc, timeout, f"{worker} on {np_} ranks")
    if expect_fail:
        assert proc.returncode != 0, f"{worker} was expected to fail:\n{log[-4000:]}"
        return log
    assert proc.returncode == 0, f"{worker} failed (exit {proc.returncode}):\n{log[-6000:]}"
    reports = []
    for r in range(np_):
        path = out / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no report:\n{log[-4000:]}"
        reports.append(json.loads(path.read_text()))
    return reports


def run_cluster(worker, tmp_path, args=(), local=None, np_per_node=None, timeout=240, env=None):
    """Runs tests/workers/<worker> through tfc_apps.cluster_launch: on the namespaces made by
    scripts/emulate_cluster.sh, or with ``local=M`` on 127.0.0.1. Returns (reports, log)."""
    out = Path(tmp_path) / f"cluster_{worker.replace('.py', '')}"
    out.mkdir(parents=True, exist_ok=True)
    opts = (["--local", str(local)] if local else []) + \
        (["--np-per-node", str(np_per_node)] if np_per_node else [])
    cmd = [sys.executable, "-m", "tfc_apps.cluster_launch", *opts, "--timeout", str(timeout), "--",
           sys.executable, str(WORKERS / worker), *map(str, args)]
    full_env = dict(os.environ, HVD_TEST_OUT=str(out), PYTHONPATH=str(ROOT),
                    TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    full_env.update(env or {})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env,
                            text=True, cwd=ROOT)
    try:   # the launcher enforces the timeout itself; this is a backstop that lets it clean up
        log, _ = proc.communicate(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        proc.terminate()   # SIGTERM: the launcher kills its ranks and stops its rendezvous server
        log, _ = proc.communicate()
        raise AssertionError(f"cluster_launch of {worker} hung:\n{log[-4000:]}")
    assert proc.returncode == 0, f"{worker} failed (exit {proc.returncode}):\n{log[-6000:]}"
    ranks = sorted(int(p.stem[4:]) for p in out.glob("rank*.json"))
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in ranks]
    assert ranks == list(range(len(ranks))) and ranks, f"missing rank reports {ranks}:\n{log[-4000:]}"
    return reports, log
