"""The emulated public-cloud cluster: 2 network namespaces x 2 ranks behind a tbf-shaped link.

scripts/emulate_cluster.sh builds it (root only) and tfc_apps.cluster_launch starts Horovod ranks
in it; tf_commlib.init() must see the 2x2 layout from Horovod's local/cross ranks alone, and data
between nodes must cross the slow link while data inside a node does not.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests import hvdrun

SCRIPT = hvdrun.ROOT / "scripts" / "emulate_cluster.sh"
M, N, MBIT = 2, 2, 200


def _sh(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def _netns():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0:
        pytest.fail("test_emulated_cluster needs root: it creates network namespaces, veths, a "
                    "bridge and tbf qdiscs (run the tests as root, as CI does)", pytrace=False)
    try:
        up = _sh("up", str(M), str(N), "--inter-mbit", str(MBIT))
        if up.returncode != 0:
            pytest.fail(f"could not build the emulated cluster (`ip netns add` impossible here?):\n"
                        f"{up.stdout}{up.stderr}", pytrace=False)
        yield
    finally:
        down = _sh("down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert "tfc-" not in _netns(), _netns()


def _check_layout(reports, m, n, shm_across_nodes=None):
    assert len(reports) == m * n
    inputs = np.array([r["input"] for r in reports], dtype=np.float32)
    expect = inputs.reshape(m, n, -1).sum(axis=1, dtype=np.float32).sum(axis=0, dtype=np.float32)
    for rank, r in enumerate(reports):
        node, local = divmod(rank, n)
        assert (r["m"], r["n"], r["node"], r["local"]) == (m, n, node, local)
        assert r["intra_ranks"] == r["intra_members"] == [node * n + j for j in range(n)]
        assert r["inter_ranks"] == r["inter_members"] == [i * n + local for i in range(m)]
        np.testing.assert_allclose(r["hier"], inputs.sum(axis=0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(r["hier"], expect, rtol=1e-6, atol=1e-6)
        assert r["hier_graph"] == r["hier"]
        # Shared memory only inside a node: a node is a network namespace (or, with --local, a
        # separately launched group that still shares this machine's namespace).
        assert r["shared_memory"]["intra"] == (n > 1)
        if shm_across_nodes is not None:
            assert r["shared_memory"]["inter"] == r["shared_memory"]["world"] == shm_across_nodes
    assert all(r["hier"] == reports[0]["hier"] for r in reports)


def test_layout_comes_from_horovod_ranks(cluster, tmp_path):
    # No TF_COMMLIB_TOPOLOGY: the launcher removes it, the layout is Horovod's local/cross ranks.
    reports, _ = hvdrun.run_cluster("topology_worker.py", tmp_path, timeout=120)
    _check_layout(reports, M, N, shm_across_nodes=False)


def test_inter_node_link_is_shaped(cluster):
    cmd = [sys.executable, "-m", "tfc_apps.cluster_launch", "--check-link", "--timeout", "120"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=hvdrun.ROOT,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    found = re.search(r"intra-node ([\d.]+) Mbit/s .* inter-node ([\d.]+) Mbit/s", log)
    assert found, log[-4000:]
    intra, inter = map(float, found.groups())
    print(f"intra-node {intra:.0f} Mbit/s, inter-node {inter:.0f} Mbit/s, link {MBIT} Mbit/s")
    assert inter < 1.15 * MBIT, f"the inter-node link is not shaped: {inter} Mbit/s"
    assert inter > 0.3 * MBIT, f"the inter-node link is far below its rate: {inter} Mbit/s"
    assert intra > 2 * inter, f"intra-node {intra} Mbit/s is not faster than inter-node {inter}"


def test_local_mode_without_namespaces(tmp_path):
    reports, _ = hvdrun.run_cluster("topology_worker.py", tmp_path, local=M, np_per_node=N, timeout=120)
    _check_layout(reports, M, N, shm_across_nodes=True)


RACE = """
import os, signal, sys, time
flag = sys.argv[1]
if os.environ["HOROVOD_RANK"] == "1":   # dies first, by SIGKILL
    open(flag, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
while not os.path.exists(flag):   # rank 0 sees it and aborts ~10 ms later: inside one 50 ms poll
    time.sleep(0.001)
time.sleep(0.01)
os.abort()
"""


def test_the_first_rank_to_die_gives_the_exit_status(tmp_path):
    # rank 1 is killed, rank 0 aborts right after; the launcher reports rank 1's SIGKILL (137), not
    # the lowest failed rank's SIGABRT (134) although both died between two of its polls
    for i in range(3):
        flag = tmp_path / f"dead{i}"
        p = subprocess.run([sys.executable, "-m", "tfc_apps.cluster_launch", "--local", "1", "--np-per-node", "2",
                            "--timeout", "60", "--", sys.executable, "-c", RACE, str(flag)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 137, p.stderr[-3000:]
        assert "rank 1 exited with status -9" in p.stderr, p.stderr[-3000:]


FAST_MBIT, RESHAPED_MBIT = 1000, 20


def _run_reshaped(worker, tmp_path, first_mbit, then_mbit):
    """Runs the worker on the cluster with its inter-node link at first_mbit, re-shaped to then_mbit when the
    worker asks (a file reshape.request in HVD_TEST_OUT; the test answers reshape.done), then back to MBIT."""
    import threading
    import time

    out = tmp_path / f"cluster_{worker.removesuffix('.py')}"
    out.mkdir()
    stop, shaped = threading.Event(), []

    def reshape_when_asked():
        while not stop.is_set():
            if (out / "reshape.request").exists():
                shaped.append(_sh("reshape", "--inter-mbit", str(then_mbit)))
                (out / "reshape.done").touch()
                return
            time.sleep(0.05)

    fast = _sh("reshape", "--inter-mbit", str(first_mbit))
    assert fast.returncode == 0, fast.stdout + fast.stderr
    watcher = threading.Thread(target=reshape_when_asked, daemon=True)
    watcher.start()
    try:
        reports, _ = hvdrun.run_cluster(worker, tmp_path, timeout=400)
    finally:
        stop.set()
        watcher.join()
        back = _sh("reshape", "--inter-mbit", str(MBIT))
        assert back.returncode == 0, back.stdout + back.stderr
    assert shaped and shaped[0].returncode == 0, shaped
    return reports


def test_auto_follows_a_link_that_changes_mid_run(cluster, tmp_path):
    """DistributedOptimizer(algorithm="auto") (dense and hitopk at density 0.25: DiLoCo rounds or a sparser
    candidate win on either link for this model of a few ms of compute) trains 2 epochs at FAST_MBIT, the
    link is re-shaped to RESHAPED_MBIT (scripts/emulate_cluster.sh reshape): the step time it measures has it
    calibrate the link again, every choice is the model's from what was measured (replayed), and two epochs
    after the change the model prefers what a run starting on the new link would choose, a lossy candidate:
    it runs it, or stays only because the trace a switch costs outweighs the last epoch's gain (that
    choice replayed with a free trace is the lossy one; on a loaded machine a trace takes seconds)."""
    from tf_commlib.auto.decide import replay
    from tf_commlib.collectives import ALGORITHMS

    reports = _run_reshaped("auto_reshape_worker.py", tmp_path, FAST_MBIT, RESHAPED_MBIT)
    first = reports[0]
    print({k: first[k] for k in ("choices", "recalibrations", "beta_inter", "calibration_s", "fit_s")})
    assert all(r["choices"] == first["choices"] for r in reports)
    # epoch 2's choice is made before its steps cross the slow link; its measured step has the link
    # calibrated again, and at epoch 4 (two epochs after the change) the model prefers what a run starting
    # on the new link would: a lossy candidate, 1 MB of gradients being slow to send there
    decisions = [row for row in first["log"] if "choice" in row and "inputs" in row]
    assert [replay(d) for d in decisions] == [d["choice"] for d in decisions], first["log"]
    last = next(d for d in decisions if d["epoch"] == 4)
    free = {**last, "inputs": {**last["inputs"], "trace_s": 0.0}}
    assert ALGORITHMS[first["from_scratch"]].lossy and ALGORITHMS[replay(free)].lossy, first["log"]
    assert first["recalibrations"] == 1
    old, new = first["beta_inter"]   # seconds per byte: 8 / bit rate
    assert 0.5 < new / (8 / (RESHAPED_MBIT * 1e6)) < 2.0 and new > 4 * old, first["beta_inter"]


SLOW_MBIT = 5


def test_diloco_auto_interval_follows_a_link_that_changes_mid_run(cluster, tmp_path):
    """DiLoCo(sync_every="auto"), 1 MB of weights: 2 epochs at FAST_MBIT, then SLOW_MBIT. The first choice
    (after epoch 1, the first with untraced syncs) is made on the fast link; every choice after the change
    is made from the slow exchanges (at least 10x longer) and takes an H at least 4x as large (or the
    largest), the smallest that hides them; every rank chooses alike and ends with the same weights."""
    from tf_commlib.keras.diloco import AUTO_INTERVALS, choose_interval

    reports = _run_reshaped("diloco_reshape_worker.py", tmp_path, FAST_MBIT, SLOW_MBIT)
    first = reports[0]
    print(first["log"], first["epochs"])
    assert all(r["log"] == first["log"] and r["final"] == first["final"] for r in reports)
    log = first["log"]
    assert [row["steps"] for row in log] == [20, 30, 40, 50], log
    for row in log:
        assert row["sync_every"] == choose_interval(row["exchange_s"], row["sync_s"], row["step_s"])
    before, after = log[0], log[1:]
    assert before["sync_every"] < AUTO_INTERVALS[-1], log   # room to grow
    assert first["epochs"][2] == before["sync_every"] and first["epochs"][3:] == [r["sync_every"] for r in after[:2]]
    for row in after:
        assert row["exchange_s"] > 10 * before["exchange_s"], log
        assert row["sync_every"] >= min(4 * before["sync_every"], AUTO_INTERVALS[-1]), log
