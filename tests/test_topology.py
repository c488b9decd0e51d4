"""Topology and process sets under horovodrun, for the 2x2, 1x4 and 4x1 layouts; 1x4 is the layout
4 ranks on one machine get by default (no override); 2x2 also with shared memory turned off."""
import numpy as np
import pytest

from tests import hvdrun
from tests.workers.sequence_worker import cases_file
from tf_commlib.topology import layout_sets, parse_layout

# layout -> the override its job is started with (None: Horovod's layout, one node of 4 ranks) and
# the TF_COMMLIB_SHM settings its ranks run topology_worker.py with, one after another in the job:
# "0" first, so that it runs as in a job started with TF_COMMLIB_SHM=0 (no set has done its
# shared-memory handshake yet; tf_commlib.shm reads the variable at each call)
JOBS = {"2x2": ("2x2", ("0", "1")), "1x4": (None, ("1",)), "4x1": ("4x1", ("1",))}
_runs = {}


@pytest.fixture
def topology_run(tmp_path):
    """topology_worker.py's reports on 4 ranks for (layout, TF_COMMLIB_SHM); one job per layout."""
    def run(layout, shm):
        if layout not in _runs:
            override, settings = JOBS[layout]
            cases = {f"shm{s}": ("tests.workers.topology_worker", [], {"TF_COMMLIB_SHM": s}) for s in settings}
            _runs[layout] = hvdrun.run("sequence_worker.py", 4, tmp_path, args=[cases_file(tmp_path, cases)],
                                       topology=override)
        return [r[f"shm{shm}"] for r in _runs[layout]]
    return run


@pytest.mark.parametrize("layout,shm", [("2x2", "1"), ("1x4", "1"), ("4x1", "1"), ("2x2", "0")])
def test_process_sets_and_hierarchical_allreduce(layout, shm, topology_run):
    m, n = map(int, layout.split("x"))
    reports = topology_run(layout, shm)
    inputs = np.array([r["input"] for r in reports], dtype=np.float32)
    for rank, r in enumerate(reports):
        node, local = divmod(rank, n)
        assert (r["m"], r["n"], r["node"], r["local"]) == (m, n, node, local)
        assert r["intra_ranks"] == [node * n + j for j in range(n)]
        assert r["inter_ranks"] == [i * n + local for i in range(m)]
        # The process sets really contain those ranks, in that order.
        assert r["intra_members"] == r["intra_ranks"]
        assert r["inter_members"] == r["inter_ranks"]
        # Sum per node in float32 first, then across nodes: what the hierarchy computes.
        expect = inputs.reshape(m, n, -1).sum(axis=1, dtype=np.float32).sum(axis=0, dtype=np.float32)
        np.testing.assert_allclose(r["hier"], inputs.sum(axis=0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(r["hier"], expect, rtol=1e-6, atol=1e-6)
        assert r["hier_graph"] == r["hier"]
        # One machine: every set of more than one rank may use shared memory, unless turned off.
        assert r["shared_memory"] == {"intra": n > 1 and shm == "1", "inter": m > 1 and shm == "1",
                                      "world": shm == "1"}
    # Identical on every rank, bit for bit.
    assert all(r["hier"] == reports[0]["hier"] for r in reports)


@pytest.mark.parametrize("mode", ["alltoall", "allreduce", "native", "shm"])
def test_reducescatter_modes(mode, topology_run):
    reports = topology_run("2x2", "1")
    inputs = np.array([r["input"] for r in reports], dtype=np.float32)
    s = inputs.shape[1] // 2
    for rank, r in enumerate(reports):
        node, local = divmod(rank, 2)
        want = inputs[2 * node:2 * node + 2, local * s:(local + 1) * s].sum(axis=0, dtype=np.float32)
        np.testing.assert_array_equal(r["reducescatter"][mode], want)   # a + b: one rounding, any order


def test_default_layout_is_one_node(topology_run):
    # the 1x4 job: started without TF_COMMLIB_TOPOLOGY (the launcher removes it), Horovod's local size
    reports = topology_run("1x4", "1")
    assert [(r["m"], r["n"]) for r in reports] == [(1, 4)] * 4


def test_override_must_match_world_size(monkeypatch):
    """What each rank of a 2-rank job started with TF_COMMLIB_TOPOLOGY=2x2 runs: init() raises
    before hvd.init(), on horovodrun's HOROVOD_SIZE (the 2x2 and 4x1 jobs above get their layout
    from both variables)."""
    from tf_commlib.topology import init

    monkeypatch.setenv("HOROVOD_SIZE", "2")
    monkeypatch.setenv("TF_COMMLIB_TOPOLOGY", "2x2")
    with pytest.raises(ValueError, match="2x2=4 ranks but the world size is 2"):
        init()


def test_parse_layout_and_sets():
    assert parse_layout("3x1", 3) == (3, 1)
    with pytest.raises(ValueError, match="MxN"):
        parse_layout("four", 4)
    with pytest.raises(ValueError, match="world size is 6"):
        parse_layout("2x2", 6)
    assert layout_sets(2, 3) == ([[0, 1, 2], [3, 4, 5]], [[0, 3], [1, 4], [2, 5]])


def test_reducescatter_mode_is_checked(monkeypatch):
    from tf_commlib import primitives
    monkeypatch.setenv("TF_COMMLIB_REDUCESCATTER", "ring")
    with pytest.raises(ValueError, match="TF_COMMLIB_REDUCESCATTER"):
        primitives._reducescatter_mode()
