"""tfc_apps.local_run, the one launcher: the command lines it builds, and a job that runs past its
timeout has every rank killed (horovodrun sees them die and exits by itself, so its resource tracker
unlinks the job's semaphores) and nothing of it is left."""
import sys
import time
import uuid

import psutil
import pytest

from tfc_apps import local_run


def test_command_lines():
    py = sys.executable
    assert local_run.command(["-m", "x", 1]) == [py, "-m", "x", "1"]
    hvd = local_run.command(["-m", "x"], 4)
    assert hvd == [py, "-m", "tfc_apps.horovodrun", "-np", "4", "-H", "localhost:4", "--gloo", py, "-m", "x"]
    prefix = local_run.cluster_launch_prefix(local=2, np_per_node=2, timeout=60)
    assert prefix == [py, "-m", "tfc_apps.cluster_launch", "--local", "2", "--np-per-node", "2", "--timeout", "60",
                      "--"]
    assert local_run.command(["a.py"], 4, launcher=prefix) == [*prefix, py, "a.py"]


def test_job_env(monkeypatch):
    monkeypatch.setenv("TF_COMMLIB_TOPOLOGY", "4x1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = local_run.job_env()
    assert "TF_COMMLIB_TOPOLOGY" not in env and env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert env["PYTHONPATH"].split(":") == [str(local_run.ROOT), "/elsewhere"]
    assert local_run.job_env("2x2", {"A": "1"})["TF_COMMLIB_TOPOLOGY"] == "2x2"
    monkeypatch.delenv("PYTHONPATH")
    assert local_run.job_env()["PYTHONPATH"] == str(local_run.ROOT)   # no empty entry (the cwd)


def _left(marker):
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def test_plain_process_past_its_timeout_is_killed():
    marker = f"plain-{uuid.uuid4().hex}"
    start = time.monotonic()
    with pytest.raises(local_run.JobTimeout):
        local_run.run(["-c", f"import time; time.sleep(600)  # {marker}"], timeout=2)
    assert time.monotonic() - start < 30
    assert _left(marker) == []


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_ranks_past_the_timeout_are_killed(tmp_path):
    marker = f"rank-{uuid.uuid4().hex}"
    code = (f"import os, pathlib, time; pathlib.Path({str(tmp_path)!r}, os.environ['HOROVOD_RANK']).touch(); "
            f"time.sleep(600)  # {marker}")
    proc = local_run.start(["-c", code], 2)
    deadline = time.monotonic() + 300
    while len(list(tmp_path.iterdir())) < 2:   # both ranks are running
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    with pytest.raises(local_run.JobTimeout) as failed:
        local_run.wait(proc, timeout=1)
    assert failed.value.returncode == 1, failed.value.log[-3000:]   # horovodrun exited by itself
    assert "Exit code: 137" in failed.value.log   # ... having seen its ranks SIGKILLed
    assert _left(marker) == []
    assert not local_run.signal_group(proc.pid, 0)   # nothing is left of its process group
