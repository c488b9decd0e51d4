"""scripts/slurm/dawnbench.sbatch under a real Slurm on this machine (tests/slurm_cluster.py): the
DAWNBench script's scaled digits configuration (the digits as an ImageNet-layout JPEG folder through
DataCache, two short progressive-resizing stages, the small model, hitopk then 2dtar with LARS) on
2 nodes x 2 tasks runs to completion as a batch job, every rank holding the same weights, and leaves
nothing behind."""
import json
import sys

from tests import hvdrun
from tests.test_slurm import ENV, _assert_clean, _log
from tfc_apps import digits

DAWNBENCH = hvdrun.ROOT / "scripts" / "slurm" / "dawnbench.sbatch"


def test_dawnbench_job_completes(slurm, tmp_path):
    data = digits.write_image_folder(tmp_path / "digits", size=32)
    d = tmp_path / "job"
    d.mkdir()
    args = ["--data", data, "--model", "small", "--stages", "32:1:16,40:1:16", "--steps-per-epoch", "3",
            "--schedule", "0:hitopk,1:2dtar", "--optimizer", "lars", "--breakdown-steps", "0",
            "--log-dir", d / "log", "--ckpt-dir", d / "ckpt", "--cache-dir", d / "cache"]
    job = slurm.submit(DAWNBENCH, *args, sbatch=["-N2", "--ntasks-per-node=2", "--overcommit", "--gpus-per-task=0"],
                       env=dict(ENV, TF_COMMLIB_ROOT=str(hvdrun.ROOT), TF_COMMLIB_PYTHON=sys.executable),
                       chdir=d)
    info = slurm.wait(job)
    log = _log(d, job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert "4 ranks on tfc1:2,tfc2:2" in (d / "job.out").read_text(), log
    rank0 = (d / f"slurm-{job}.rank0.out").read_text()
    assert "small, 2x2 ranks" in rank0, log   # init() found Slurm's 2 nodes x 2 tasks
    assert "weights identical on all 4 ranks" in rank0, log
    for rank in range(1, 4):
        assert (d / f"slurm-{job}.rank{rank}.out").exists(), log
    rows = [json.loads(line) for line in (d / "log" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["resolution"], r["algorithm"]) for r in rows] == [(1, 32, "hitopk"), (2, 40, "2dtar")]
    assert all(0.0 <= r["top5"] <= 1.0 for r in rows)
    _assert_clean(job)
