"""/dev/shm segments against another local user: a 2x2 job under horovodrun while uid
nobody watches /dev/shm, opens every segment it sees, plants guessed names (mode 0666 files full of
negative row counts and set flags, symbolic links to a file of root's) and pre-creates the names of
a set whose secret leaked; and while the job's own user corrupts a control segment. No data is
read, nothing hangs, root's file is unchanged, every rank gets numpy's result or a clear error, and
nothing is left in /dev/shm, also when a rank fails in its first step."""
import hashlib
import hmac
import json
import mmap
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests import hvdrun
from tests.test_shm import _check_rs

NOBODY = 65534
LEAKED = hashlib.sha256(b"tf_commlib test: a leaked secret").digest()   # as in shm_attack_worker.py
CONTROL_BYTES, ABANDONED_AT, ROWS_AT, ENTRY_BYTES = 8712, 512, 520, 64   # ops/shm/shm_channel.h
TIMEOUT = "20"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacker runs as uid nobody: needs root (CI runs as root)")


def _leaked_name(key):
    return "tfcl_" + hmac.new(LEAKED, key.encode(), hashlib.sha256).hexdigest()[:32]


def _ours():
    """tfcl_* names of this uid in /dev/shm (the format of ops/shm: tfcl_ and 32 hex digits)."""
    names = set()
    for name in os.listdir("/dev/shm"):
        try:
            if re.fullmatch(r"tfcl_[0-9a-f]{32}", name) and os.lstat("/dev/shm/" + name).st_uid == os.geteuid():
                names.add(name)
        except FileNotFoundError:
            pass
    return names


def _corrupt(out_dir, stop, log):
    """Once rank 0 names the graph call's control segment and it appears, writes -5 into every
    rank's row count and the closing reason in a loop: what the job must reject, whoever writes it."""
    segments = Path(out_dir, "segments.json")
    while not stop.is_set() and not segments.exists():
        time.sleep(0.005)
    if stop.is_set():
        return
    name = next(v for k, v in json.loads(segments.read_text()).items() if k.startswith("0/") and "corrupted" in k)
    while not stop.is_set():
        try:
            fd = os.open("/dev/shm/" + name, os.O_RDWR | os.O_NOFOLLOW)
            break
        except FileNotFoundError:
            time.sleep(0.0005)
    else:
        return
    with mmap.mmap(fd, CONTROL_BYTES) as m:
        os.close(fd)
        log.append(name)
        rows = np.frombuffer(m, np.int64)[ROWS_AT // 8::ENTRY_BYTES // 8][:128]
        abandoned = np.frombuffer(m, np.int64)[ABANDONED_AT // 8:][:1]
        while not stop.wait(0.0002):
            rows[:] = -5
            abandoned[:] = -5
        del rows, abandoned


def test_other_user_cannot_read_or_disturb_shared_memory(tmp_path):
    victim = tmp_path / "root_file"
    victim.write_bytes(b"root's data\n" * 100)
    victim.chmod(0o644)
    before, content = _ours(), victim.read_bytes()
    plant = [[_leaked_name("rs"), "file"], [_leaked_name("ag"), "symlink"]]
    attacker = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3",
         str(Path(hvdrun.WORKERS, "shm_attacker.py")), str(victim), json.dumps(plant)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    stop, corrupted = threading.Event(), []
    out_dir = tmp_path / "hvd_shm_attack_worker"
    corrupter = threading.Thread(target=_corrupt, args=(out_dir, stop, corrupted), daemon=True)
    try:
        assert attacker.stdout.readline().strip() == "ready"
        corrupter.start()
        start = time.monotonic()
        reports = hvdrun.run("shm_attack_worker.py", 4, tmp_path, args=["attack"], topology="2x2",
                             env={"TF_COMMLIB_SHM_TIMEOUT": TIMEOUT}, timeout=300)
        elapsed = time.monotonic() - start
    finally:
        stop.set()
        out, _ = attacker.communicate("stop\n", timeout=60)
        corrupter.join(10)
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["uid"] == NOBODY and seen["planted"] >= 2
    # the attacker saw the job's segments in the listing yet could open, read, write, remove none
    job_names = [n for n, uid in seen["seen"].items() if uid == 0]
    assert job_names, f"the attacker saw no segment of the job: {seen}"
    assert seen["opened"] == seen["read"] == seen["written"] == seen["unlinked"] == []
    assert victim.read_bytes() == content and victim.stat().st_uid == 0
    for r in reports:   # intra-node sets: numpy's result on every rank
        members = [q for q in range(4) if q // 2 == r["rank"] // 2]
        for step, (x, got, rows, gathered) in enumerate(r["intra"]):
            _check_rs([reports[q]["intra"][step][0] for q in range(4)], got, members, members.index(r["rank"]))
            want = np.concatenate([np.array(reports[q]["intra"][step][2]).reshape(-1, 3) for q in members])
            np.testing.assert_array_equal(np.array(gathered).reshape(want.shape), want)
        world = r["world"]   # a pre-created name is an error on every rank, at once
        assert re.match(r"(PermissionDenied|AlreadyExists)Error: .*(already exists|refusing .*uid 65534)",
                        world["rs"][0]), world["rs"]
        assert re.match(r"(PermissionDenied|AlreadyExists)Error: .*(already exists|symbolic link)",
                        world["ag"][0]), world["ag"]
        assert world["rs"][1] < 5 and world["ag"][1] < 5
        assert world["corrupted"][0].startswith("DataLossError:") and "invalid value" in world["corrupted"][0]
        assert world["corrupted"][1] < float(TIMEOUT)
        assert r["left_in_dev_shm"] == []
    assert corrupted == [reports[0]["names"][k] for k in reports[0]["names"] if k.startswith("0/") and "corrupted" in k]
    assert elapsed < 300
    # nothing of the job's is left: no name it used, no segment the attacker saw
    used = {n for r in reports for n in r["names"].values()} | set(job_names)
    assert not used & _ours() - before
    assert not any(os.path.lexists(f"/dev/shm/{name}") for name, _ in plant)


def test_rank_failing_in_its_first_step_leaves_nothing(tmp_path):
    before = _ours()
    log = hvdrun.run("shm_attack_worker.py", 4, tmp_path, args=["first_step"], topology="2x2",
                     env={"TF_COMMLIB_SHM_TIMEOUT": TIMEOUT}, timeout=120, expect_fail=True)
    assert "this rank fails in its first step (control segment seen: True)" in log, log[-3000:]
    time.sleep(0.5)
    left = _ours() - before
    time.sleep(2)   # another job's segments on this machine come and go; a leaked one stays
    assert {n for n in left if os.path.lexists("/dev/shm/" + n)} == set(), log[-3000:]
    assert not os.path.exists("/dev/shm/" + _leaked_name("rs"))
