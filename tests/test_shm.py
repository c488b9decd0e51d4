"""tf_commlib.shm under horovodrun: every rank gets the numpy result, bit for bit, and misuse
raises on every rank instead of hanging."""
import numpy as np
import pytest

from tests import hvdrun


def _rank_order_sum(blocks):
    total = blocks[0]
    for b in blocks[1:]:
        total = total + b      # ((x0 + x1) + x2) ...: the order the reduce-scatter adds in
    return total


def _check_rs(ins, got, ranks, me):
    xs = [np.array(ins[r], np.float32) for r in ranks]
    s = len(xs[0]) // len(ranks)
    want = _rank_order_sum([x[me * s:(me + 1) * s] for x in xs])
    np.testing.assert_array_equal(np.array(got, np.float32), want)


@pytest.mark.parametrize("layout", ["2x2", "1x4"])
def test_shm_collectives_match_numpy(layout, tmp_path):
    m, n = map(int, layout.split("x"))
    reports = hvdrun.run("shm_worker.py", 4, tmp_path, topology=layout,
                         env={"TF_COMMLIB_SHM_TIMEOUT": "5"})
    for r in reports:
        node, local = divmod(r["rank"], n)
        members = {"intra": [node * n + j for j in range(n)], "world": list(range(4))}
        assert r["available"] == {"intra": True, "world": True}
        for tag, ranks in members.items():
            me = ranks.index(r["rank"])
            for call, (_, got) in enumerate(r["rs"][tag]):
                _check_rs([reports[q]["rs"][tag][call][0] for q in range(4)], got, ranks, me)
            for call, (_, got) in enumerate(r["ag"][tag]):
                parts = [np.array(reports[q]["ag"][tag][call][0]) for q in ranks]
                want = np.concatenate([p.reshape(-1, *parts[-1].shape[1:]) for p in parts])
                np.testing.assert_array_equal(np.array(got).reshape(want.shape), want)
            g = r[f"graph_{tag}"]
            ins = [reports[q][f"graph_{tag}"]["inputs"] for q in range(4)]
            for run in g["runs"]:
                _check_rs([i[0] for i in ins], run[0], ranks, me)
                _check_rs([i[1] for i in ins], run[1], ranks, me)
                np.testing.assert_array_equal(run[2], np.concatenate([ins[q][2] for q in ranks]))
                _check_rs([np.float32(2) * np.array(i[0], np.float32) for i in ins], run[3], ranks, me)
        e = r["errors"]
        assert e["ok_2k"] == [float(n)] * 2
        lengths = ", ".join(str(2 * n if j == 0 else 4 * n) for j in range(n))
        assert e["rs_length"].startswith("InvalidArgumentError")
        assert f"shm reduce-scatter: ranks of the process set passed tensors with different lengths " \
               f"(by rank of the set: {lengths})" in e["rs_length"]
        # every rank maps the next segments afresh: no stale mapping of the length-2k call
        assert e["after_length"] == [float(sum(range(1, n + 1)))] * 2
        if local == n - 1:   # its length is not a multiple of n: its own error; the others abort
            assert e["rs_local"].startswith("InvalidArgumentError") and "multiple of the set size" in e["rs_local"]
        else:
            assert e["rs_local"].startswith("AbortedError") and f"rank {n - 1} of the process set failed" in e["rs_local"]
        assert e["after_local"] == [float(n)]
        assert "different dtypes or row shapes" in e["ag_dtype"]
        assert "different dtypes or row shapes" in e["ag_row"]
        assert e["after_ag"] == [[j, j] for j in range(n)]
        if local == 0:
            assert "did not arrive within 5 s" in r["timeout"]
        assert r["left_in_dev_shm"] == []               # segments are unlinked once mapped


@pytest.mark.parametrize("value", ["0", "-3", "nan", "ten"])
def test_timeout_must_be_positive(value, monkeypatch):
    from tf_commlib import shm
    monkeypatch.setenv("TF_COMMLIB_SHM_TIMEOUT", value)
    with pytest.raises(ValueError, match="TF_COMMLIB_SHM_TIMEOUT"):
        shm._timeout()
