"""scripts/slurm/train.sbatch under a real Slurm on this machine (tests/slurm_cluster.py): 4 ranks on
one node as 2x2 through --topology, the same result as horovodrun; 2 nodes x 2 tasks with no
--topology: tf_commlib.init() finds 2x2 from Slurm's layout, and a failing rank fails the job with
its exit status, as does a rank killed by a signal; scancel leaves nothing behind and a requeued
job resumes from its checkpoint and ends where an uninterrupted run ends. Runs are tiny (3 epochs
of digits); jobs use --overcommit. Also the discovery script for elastic jobs in a Slurm allocation."""
import json
import re
import subprocess
import sys
import time

import pytest

from tests import hvdrun
from tests.slurm_cluster import leftovers

TRAIN = hvdrun.ROOT / "scripts" / "slurm" / "train.sbatch"
SBATCH = ["-N1", "-n4", "--overcommit"]
ARGS = ["--algorithm", "hitopk", "--epochs", "3", "--batch-size", "32"]
TOPOLOGY = ["--topology", "2x2"]
ENV = {"TF_COMMLIB_PYTHON": sys.executable, "PYTHONPATH": str(hvdrun.ROOT), "TF_CPP_MIN_LOG_LEVEL": "2",
       "CUDA_VISIBLE_DEVICES": ""}


def _train(slurm, tmp_path, sbatch=SBATCH, args=TOPOLOGY, env=None, name="job"):
    """Submits train.sbatch with ARGS, a checkpoint directory and a JSON summary; returns (id, dir)."""
    d = tmp_path / name
    d.mkdir()
    job = slurm.submit(TRAIN, *ARGS, *args, "--ckpt-dir", d / "ckpt", "--json", d / "summary.json",
                       sbatch=sbatch, env=dict(ENV, **(env or {})), chdir=d)
    return job, d


def _log(d, job):
    ranks = sorted(d.glob(f"slurm-{job}.rank*.out"))
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in [d / "job.out", *ranks] if p.exists())


def _epochs(d, job):
    """Epoch numbers rank 0 printed, one list per run of the job (its output is appended across
    requeues; each run begins with the layout line)."""
    runs = re.split(r"ranks as \d+x\d+ ", (d / f"slurm-{job}.rank0.out").read_text())[1:]
    return [[int(e) for e in re.findall(r"\] epoch +(\d+) ", run)] for run in runs]


def _stats(summary):
    """The weights' count, sum and l2 (their sha256 is bit-level: equal only under --deterministic)."""
    return {k: v for k, v in summary["weights"].items() if k != "sha256"}


def _assert_clean(job):
    left = leftovers(job)
    assert left == {"processes": [], "shm": []}, f"job {job} left {left}"


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory):
    """The reference run: train.sbatch, 4 tasks, to completion."""
    tmp = tmp_path_factory.mktemp("slurm_train")
    job, d = _train(slurm, tmp)
    info = slurm.wait(job)
    return job, d, info


def test_train_job_matches_horovodrun(uninterrupted, tmp_path):
    job, d, info = uninterrupted
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), _log(d, job)
    assert _epochs(d, job) == [[1, 2, 3]], _log(d, job)
    assert "test acc" in (d / f"slurm-{job}.rank0.out").read_text()
    for rank in range(4):   # every rank ran in the job, with its own output
        assert (d / f"slurm-{job}.rank{rank}.out").exists()
    assert re.search(r"4 ranks on tfc\d:4, ", (d / "job.out").read_text()), _log(d, job)
    assert "4 ranks as 2x2 (nodes x ranks per node)" in (d / f"slurm-{job}.rank0.out").read_text()
    slurm_run = json.loads((d / "summary.json").read_text())
    assert slurm_run["epochs"][-1]["test_accuracy"] > 0.3   # it learned (10 classes: chance is 0.1)
    assert not list((d / "ckpt").glob("rank*")), "a finished run removes its backups"
    _assert_clean(job)

    # The same arguments under horovodrun --gloo on 4 local ranks.
    summary = tmp_path / "horovodrun.json"
    hvdrun.run_command(["-m", "tfc_apps.train", *ARGS, *TOPOLOGY, "--ckpt-dir", tmp_path / "ckpt",
                        "--json", summary], 4, 900, env=ENV)
    hvd_run = json.loads(summary.read_text())
    for key in ("algorithm", "density"):
        assert [r[key] for r in slurm_run["epochs"]] == [r[key] for r in hvd_run["epochs"]]
    for key in ("test_accuracy", "train_loss"):
        assert [r[key] for r in slurm_run["epochs"]] == pytest.approx([r[key] for r in hvd_run["epochs"]],
                                                                      rel=1e-6), key
    assert _stats(slurm_run) == pytest.approx(_stats(hvd_run), rel=1e-6)


def test_two_nodes_failing_rank_fails_the_job(slurm, tmp_path):
    """2 nodes x 2 tasks, no --topology: init() finds 2x2; rank 2 (node 1) exits with 7 as epoch 1
    begins, Horovod stops the others, and the job fails with 7."""
    job, d = _train(slurm, tmp_path, sbatch=["-N2", "--ntasks-per-node=2", "--overcommit"], args=[],
                    env={"TF_COMMLIB_TEST_FAIL_AT": "2:1:7"})
    info = slurm.wait(job)
    log = _log(d, job)
    assert "4 ranks on tfc1:2,tfc2:2" in (d / "job.out").read_text(), log
    assert "4 ranks as 2x2 (nodes x ranks per node)" in (d / f"slurm-{job}.rank0.out").read_text(), log
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "7:0"), log
    assert "exiting with 7 at epoch 1" in (d / f"slurm-{job}.rank2.out").read_text(), log
    assert "rank 2 failed first, with exit status 7" in (d / "job.out").read_text(), log
    _assert_clean(job)


def test_killed_rank_fails_the_job(slurm, tmp_path):
    """2 tasks; rank 1 dies (SIGKILL, no Python exit path) as epoch 1 begins: the job fails with its
    status, 128 + 9, not with the status of rank 0, which the dead peer stopped."""
    job, d = _train(slurm, tmp_path, sbatch=["-N1", "-n2", "--overcommit"], args=[],
                    env={"TF_COMMLIB_TEST_FAIL_AT": "1:1:-9"})
    info = slurm.wait(job)
    log = _log(d, job)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "137:0"), log
    assert "rank 1 failed first, with exit status 137" in (d / "job.out").read_text(), log
    _assert_clean(job)


def test_scancel_then_requeue_resumes(slurm, uninterrupted, tmp_path):
    job, d = _train(slurm, tmp_path, sbatch=[*SBATCH, "--requeue"])
    ckpt = d / "ckpt"

    def saved_epochs():
        epochs = []
        for rank in range(4):
            try:
                epochs.append(json.loads((ckpt / f"rank{rank}" / "training_metadata.json").read_text())["epoch"])
            except (OSError, ValueError):
                epochs.append(0)
        return epochs

    deadline = time.monotonic() + 900
    while min(saved_epochs()) < 1:   # every rank has backed up epoch 1: cancel it mid-training
        assert slurm.job(job)["JobState"] in ("PENDING", "CONFIGURING", "RUNNING"), _log(d, job)
        assert time.monotonic() < deadline, _log(d, job)
        time.sleep(0.2)
    slurm.run("scancel", job)
    info = slurm.wait(job)
    assert info["JobState"] == "CANCELLED", (info, _log(d, job))
    _assert_clean(job)
    at = saved_epochs()
    assert max(at) < 3, f"the run had finished before scancel: {at}"

    slurm.run("scontrol", "requeue", job)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")   # requeued jobs wait ~2 min
    info = slurm.wait(job)
    log = _log(d, job)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), log
    first, second = _epochs(d, job)   # the report comes before the backup: epoch min(at) was printed
    assert first == list(range(1, len(first) + 1)) and len(first) >= min(at), (at, first, log)
    assert second == list(range(min(at) + 1, 4)), f"did not resume from its backup {at}: {second}\n{log}"
    assert "restart 1" in (d / "job.out").read_text()
    resumed = json.loads((d / "summary.json").read_text())
    ref_job, ref_dir, _ = uninterrupted
    reference = json.loads((ref_dir / "summary.json").read_text())
    assert resumed["epochs"][-1]["test_accuracy"] == pytest.approx(reference["epochs"][-1]["test_accuracy"],
                                                                   abs=1e-6)
    assert _stats(resumed) == pytest.approx(_stats(reference), rel=1e-6)
    _assert_clean(job)


def test_discovery_script_lists_the_jobs_live_nodes(slurm, tmp_path):
    """scripts/slurm/discover_hosts.sh, horovodrun's --host-discovery-script inside a Slurm job: the job's
    nodes with their slots; a drained node (as after a preemption notice) drops out and is listed again
    once resumed; its output passes tfc_apps.horovodrun's check."""
    from tfc_apps.horovodrun import discovery_error

    script = hvdrun.ROOT / "scripts" / "slurm" / "discover_hosts.sh"
    hold = tmp_path / "hold.sh"
    hold.write_text("#!/bin/sh\nsleep 300\n")
    job = slurm.submit(hold, sbatch=["-N2", "--overcommit"], chdir=tmp_path)
    try:
        info = slurm.wait(job, until={"RUNNING"}, timeout=120)
        env = dict(slurm.env, SLURM_JOB_NODELIST=info["NodeList"], TF_COMMLIB_SLOTS="2")

        def listed():
            return subprocess.run([str(script)], capture_output=True, text=True, env=env, check=True,
                                  timeout=60).stdout.split()

        assert listed() == ["tfc1:2", "tfc2:2"]
        assert discovery_error(str(script), None, env=env) is None
        slurm.run("scontrol", "update", "nodename=tfc2", "state=drain", "reason=tf_commlib test")
        try:
            assert listed() == ["tfc1:2"]
        finally:
            slurm.run("scontrol", "update", "nodename=tfc2", "state=resume")
        deadline = time.monotonic() + 60   # resumed, the node is "not responding" until slurmd answers a ping
        while listed() != ["tfc1:2", "tfc2:2"] and time.monotonic() < deadline:
            time.sleep(0.5)
        assert listed() == ["tfc1:2", "tfc2:2"]
    finally:
        slurm.run("scancel", job, check=False)
        slurm.wait(job)
