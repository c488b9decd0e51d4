"""The main job (`make demo`, python -m tfc_apps.demo) end to end, shortened to 2 epochs per run on a
faster link: the topology check, the fp16 overlapped dense baseline and hitopk+mstopk on 4 ranks as
2x2 (the emulated cluster as root, else 127.0.0.1), the time-to-accuracy table, the time each
needs to reach the same accuracy and the plot of accuracy against wall-clock seconds. The command is the one docs/emulated_cluster.md
shows (tests/test_docs.py finds it here)."""
import os
import re
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
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("inter-node 500 Mbit/s") or
                line.startswith("inter-node unshaped"))
    assert [line.split()[0] for line in lines[head + 2:head + 4]] == ["dense_fp16", "hitopk"], lines[head:head + 5]
    same = next(line for line in lines if line.startswith("time to validation top-1"))
    seconds = [float(v) for v in re.findall(r"(\d+\.\d) s", same)]
    assert len(seconds) == 2 and all(s > 0 for s in seconds), same
    assert re.search(r"hitopk needs \d+\.\d\dx the baseline's time", same), same
    assert (tmp_path / "demo_out" / "tta.png").stat().st_size > 10_000
