"""The fault benchmark (`python -m tfc_apps.bench faults`) on the emulated 2x2 cluster: a
rank SIGKILLed at a step, a node's link cut, a node's Redis killed mid-epoch, a rank's checkpoint
disk full. Its output has one row per run, and the invariants hold: every rank exits soon after
the first dies, nothing is left (processes, /dev/shm, redis-servers), and the final weights equal
an uninterrupted run's bit for bit (recovered runs: their own; failed runs: resumed from their
checkpoints)."""
import json
import os
import subprocess
import sys

import pytest

from tfc_apps import local_run
from tfc_apps.bench import fault_tools

QUICK = [sys.executable, "-m", "tfc_apps.bench", "faults", "--quick"]
EXIT_TIMEOUT = 60


def _cluster_namespaces():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.timeout(600)
def test_quick_fault_runs_keep_the_invariants(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("the fault benchmark needs root here: the link cut is made in the emulated cluster's "
                    "namespaces and the full disk is a tmpfs (run the tests as root, as CI does)", pytrace=False)
    shm_before = set(os.listdir("/dev/shm"))
    out = tmp_path / "out"
    rc, log = local_run.run([*QUICK[1:], "--json", "--out", out, "--exit-timeout", EXIT_TIMEOUT],
                            timeout=540, check=False, cwd=tmp_path)
    assert rc == 0, log[-6000:]
    rows = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert [r["case"] for r in rows] == ["kill", "link", "redis", "disk"], log[-3000:]
    saved = json.loads((out / "faults.json").read_text())
    assert saved["runs"] == rows and "emulated 2x2 cluster" in saved["link"]
    assert set(saved["reference"]) == {"train", "dawnbench"}
    by = {r["case"]: r for r in rows}
    for r in rows:
        assert r["equal"] and r["digest"] == saved["reference"]["train" if r["case"] != "redis" else "dawnbench"][
            "sha256"], r
        assert r["processes_left"] == [] and r["shm_left"] == [], r
        assert (r["redis_servers_left"], r["redis_keys_left"], r["redis_dirs_left"]) == (0, 0, []), r
    # a killed rank and a full disk end the job on every rank, soon; the resumed run equals the uninterrupted one
    for case in ("kill", "disk"):
        r = by[case]
        assert r["outcome"].startswith("ranks exited, status"), r
        assert 0 <= r["exit_s"] <= EXIT_TIMEOUT, r
        assert r["resume_epoch"] in (1, 2), r   # the fault came in epoch 2 or 3 (of 3)
    assert "status 137" in by["kill"]["outcome"]   # 128 + SIGKILL, the first failure
    assert "No space left on device" in by["disk"]["detail"], by["disk"]
    # a 5 s link cut is survived (Gloo's 30 s timeout), and a dead Redis costs only fallbacks to the source
    assert by["link"]["outcome"] == "recovered" and by["link"]["delay_s"] is not None, by["link"]
    assert by["redis"]["outcome"] == "recovered", by["redis"]
    assert "1 server(s) killed" in by["redis"]["detail"], by["redis"]
    # the dead server was seen: reads fell back to the source until the retry restarted it, and the
    # restarted (empty) server missed what it had held; still nothing lost (the sha256 above)
    assert by["redis"]["fallbacks"] + by["redis"]["extra_misses"] > 0, by["redis"]
    # the benchmark cleaned up: the emulated cluster is down, no /dev/shm name of ours is left
    assert "tfc-" not in _cluster_namespaces()
    left = set(os.listdir("/dev/shm")) - shm_before - fault_tools.shm_in_use()   # live: other jobs'
    assert not [n for n in left if n.startswith(("tfcl_", "sem.mp-"))]
