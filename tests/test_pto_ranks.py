"""pto on several ranks (horovodrun): parallel_map equals local compute on every rank, bit for bit,
on 4 ranks (1x4) and 3 ranks (3x1); LARS / LAMB under DistributedOptimizer against numpy and
bit-identical across ranks after model.fit. parallel_map runs on the global process set (its
default), never on a layout's intra/inter sets: the layout does not reach it, the number of ranks
(its partition) does, so 2x2 would repeat the 4-rank 1x4 run."""
import numpy as np
import pytest

from tests import pto_reference as ref


def _check_map(reports):
    for r in reports:
        for name, res in r["map"].items():
            assert res["equal_local"], (r["rank"], name)
            assert res["digest"] == reports[0]["map"][name]["digest"], (r["rank"], name)
        want = [[np.linalg.norm(w), np.linalg.norm(g)] for w, g in ref.map_inputs(0)]
        np.testing.assert_allclose(r["norms"], want, rtol=1e-6, atol=0)
        assert r["errors"]["eager"].startswith("ValueError") and "identical on every rank" in r["errors"]["eager"]
        assert r["errors"]["graph"].startswith("InvalidArgumentError") and "identical on every rank" in r["errors"]["graph"]
        assert r["after_errors"]


@pytest.mark.parametrize("layout", ["3x1"])   # 4 ranks: test_parallel_map_lars_lamb_on_4_ranks's _check_map
def test_parallel_map_layouts(layout, shared):
    _check_map(shared(layout, "pto_map"))   # the shared job of the layout (tests/hvdrun.py SHARED)


def test_parallel_map_lars_lamb_on_4_ranks(shared):
    reports = shared("1x4", "pto_all")
    _check_map(reports)
    r0 = reports[0]
    weights = [np.array(w, np.float32) for w in r0["pto_weights"]]
    steps = [[np.array(g, np.float32) for g in s] for s in r0["pto_steps"]]
    want = ref.lars(weights, steps, 0.5, weight_decay_rate=0.01, nesterov=True)
    lamb = ref.lamb(weights, steps, 0.01, weight_decay=0.01)
    grads_by_rank = [[[np.array(g) for g in s] for s in r["tape_grads"]] for r in reports]
    mean_grads = [[np.mean([grads_by_rank[p][s][i] for p in range(4)], axis=0) for i in range(3)]
                  for s in range(3)]
    dgc = ref.dgc_lars(grads_by_rank, weights[:3], 0.5, 0.9, 0.01, 0.01)
    plain = ref.lars(weights[:3], mean_grads, 0.5, momentum=0.9, weight_decay_rate=0.01, eeta=0.01)
    assert max(np.abs(a - b).max() for a, b in zip(dgc, plain)) > 1e-4   # the two are told apart
    for r in reports:
        assert r["lars_on_off_same_bits"] and r["lamb_on_off_same_bits"]
        for got, w, got_lamb, w_lamb in zip(r["lars_on"], want, r["lamb_on"], lamb):
            np.testing.assert_allclose(got, w, rtol=0, atol=1e-6)
            np.testing.assert_allclose(got_lamb, w_lamb, rtol=0, atol=1e-6)
        # momentum correction: LARS's momentum moved into DGC's, never applied twice
        d, p = r["dgc_lars"], r["plain_lars"]
        assert (d["inner_momentum"], d["dgc_momentum"], d["inner_velocities"]) == (0.0, 0.9, 0)
        assert (p["inner_momentum"], p["inner_velocities"]) == (0.9, 3)
        for got, w in zip(d["weights"], dgc):
            np.testing.assert_allclose(got, w, rtol=0, atol=1e-6)
        for got, w in zip(p["weights"], plain):
            np.testing.assert_allclose(got, w, rtol=0, atol=1e-6)
        for kind in ("lars", "lamb"):
            assert r[kind]["digest"] == r0[kind]["digest"]      # bit-identical on all ranks
            assert r[kind]["loaded_type"] == kind.upper()
            assert r[kind]["resumed_diff"] <= 1e-6 < r[kind]["moved"]
