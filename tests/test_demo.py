"""The main job (`make demo`, python -m tfc_apps.demo) end to end, shortened to 2 epochs per run on a
faster link: the topology check, dense and hitopk+mstopk on 4 ranks as 2x2 (the emulated cluster as
root, else 127.0.0.1), the comparison table and the plot. The command is the one docs/emulated_cluster.md
shows (tests/test_docs.py finds it here)."""
import os
import shlex
import subprocess
import sys

import pytest

from tests import hvdrun

COMMAND = "python -m tfc_apps.demo --inter-mbit 500 --epochs 2"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_demo_runs_both_trainings_and_compares_them(tmp_path):
    argv = [sys.executable, *shlex.split(COMMAND)[1:], "--out", str(tmp_path / "demo_out")]
    env = dict(os.environ, PYTHONPATH=str(hvdrun.ROOT), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_COMMLIB_TOPOLOGY", None)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=850, cwd=hvdrun.ROOT, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "-> PASS" in out, out[-4000:]
    assert "hitopk+mstopk vs dense on the" in out and "x samples/s" in out, out[-4000:]
    assert (tmp_path / "demo_out" / "accuracy.png").stat().st_size > 0
