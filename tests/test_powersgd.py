"""PowerSGD (collectives/powersgd.py) and 16-bit values on the wire (collectives/wire.py): numpy
references on 4 ranks (2x2 and 1x4), bit-identical replicas, bytes moved against the formulas, and
the options and arguments by hand."""

import keras
import numpy as np
import pytest

from tests import hvdrun
from tf_commlib import alphabeta, collectives
from tf_commlib import link_bytes as L
from tf_commlib.aggregator import GradientAggregator
from tf_commlib.collectives import ALGORITHMS, powersgd, with_compression
from tf_commlib.keras import DistributedOptimizer

D, STEPS, RANK = 1500, 3, 3


def gram_schmidt(p):
    p = p.copy()
    for i in range(p.shape[1]):
        for j in range(i):
            p[:, i] -= (p[:, j] @ p[:, i]) * p[:, j]
        norm = np.linalg.norm(p[:, i])
        p[:, i] = p[:, i] / norm if norm > 0 else 0
    return p


def powersgd_ref(inputs, q0, rank=RANK):
    """inputs[step][rank] -> per step (P̂, Q, result, residuals per rank), in float64."""
    rows, cols = powersgd.shape(D)
    size = len(inputs[0])
    res, q, steps = [np.zeros(D) for _ in range(size)], np.array(q0, np.float64), []
    for xs in inputs:
        ms = [np.pad(x + r, (0, rows * cols - D)).reshape(rows, cols) for x, r in zip(xs, res)]
        p = gram_schmidt(sum(m @ q for m in ms))
        qs = [m.T @ p for m in ms]
        q = sum(qs)
        res = [(m - p @ qw.T).ravel()[:D] for m, qw in zip(ms, qs)]
        steps.append((p, q, (p @ q.T).ravel()[:D], res))
    return steps


@pytest.fixture(scope="module", params=["2x2", "1x4"])
def run(request, tmp_path_factory):
    m, n = map(int, request.param.split("x"))
    return (m, n), hvdrun.run("powersgd_worker.py", 4, tmp_path_factory.mktemp(request.param),
                              topology=request.param)


def close(got, want, what):
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(np.array(got, np.float64), want, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


def test_powersgd_matches_numpy_and_replicas_are_identical(run):
    (m, n), reports = run
    inputs = [[np.array(r["inputs"][s], np.float64) for r in reports] for s in range(STEPS)]
    ref = powersgd_ref(inputs, reports[0]["q0"]["3"])
    for r in reports:
        assert r["q0"] == reports[0]["q0"]   # the starting Q is the same on every rank
        for s, (p, q, result, res) in enumerate(ref):
            got = r["powersgd"][s]
            assert got["result"] == reports[0]["powersgd"][s]["result"]   # bit-identical
            assert got["q"] == reports[0]["powersgd"][s]["q"]
            close(got["result"], result, f"result step {s} rank {r['rank']}")
            close(np.reshape(got["q"], q.shape), q, f"Q step {s}")
            close(got["residual"], res[r["rank"]], f"residual step {s} rank {r['rank']}")
            assert got["sent"] == 0
    # error feedback conserves mass; the approximation is not the exact sum
    total = sum(np.sum(xs, axis=0) for xs in inputs)
    approx = sum(np.array(reports[0]["powersgd"][s]["result"]) for s in range(STEPS))
    left = sum(np.array(r["powersgd"][-1]["residual"]) for r in reports)
    close(approx + left, total, "mass")
    assert np.linalg.norm(left) > 0.1 * np.linalg.norm(total)
    # the bytes moved: two allreduces of rows·rank and cols·rank floats (2dtar on 2x2, dense on 1x4)
    formula = ALGORITHMS["powersgd"].sent_bytes(D, m, n, 0.01, {"rank": RANK})
    rows, cols = powersgd.shape(D)
    inner = ALGORITHMS["2dtar" if m > 1 else "dense"]
    assert formula == L.add(inner.sent_bytes(rows * RANK, m, n, 1), inner.sent_bytes(cols * RANK, m, n, 1))
    for s in range(STEPS):
        counted = {link: sum(r["powersgd"][s]["bytes"][link] for r in reports) for link in L.LINKS}
        assert counted == pytest.approx({k: 4 * v for k, v in formula.items()}, rel=1e-12)
    # below min_compression_size: the exact sum, the dense bytes, a zero state
    for r in reports:
        close(r["powersgd_dense"]["result"], np.sum(inputs[0], axis=0), "dense path")
        assert not np.any(r["powersgd_dense"]["state"])
    counted = {link: sum(r["powersgd_dense"]["bytes"][link] for r in reports) for link in L.LINKS}
    assert counted == pytest.approx({k: 4 * v for k, v in inner.sent_bytes(D, m, n, 1).items()}, rel=1e-12)


def test_powersgd_through_the_aggregator(run):
    (m, n), reports = run
    inputs = [[np.array(r["inputs"][s], np.float64) for r in reports] for s in range(STEPS)]
    ref = powersgd_ref(inputs, reports[0]["q0"]["0"])
    for r in reports:
        for s, (_, q, result, res) in enumerate(ref):
            assert r["graph"][s]["result"] == reports[0]["graph"][s]["result"]
            close(r["graph"][s]["result"], result, f"aggregator step {s}")
        close(r["graph_state"][:D], ref[-1][3][r["rank"]], "aggregator residual")
        close(np.reshape(r["graph_state"][D:], ref[-1][1].shape), ref[-1][1], "aggregator Q")
    for s in range(STEPS):
        counted = {link: sum(r["graph"][s]["bytes"][link] for r in reports) for link in L.LINKS}
        assert counted == pytest.approx({k: 4 * v for k, v in reports[0]["graph_formula"].items()}, rel=1e-12)


@pytest.mark.parametrize("compression,eps", [("fp16", 2.0 ** -10), ("bf16", 2.0 ** -7)])
def test_16_bit_wire_sums_within_rounding(run, compression, eps):
    """Each rank's x/4 rounded (eps/2 relative, or half fp16's subnormal step), then 3 additions on
    the wire, each rounding by eps/2 of a partial sum <= the sum of |x|/4: |error| <= 4·eps·Σ|x| (+
    underflow). Beyond range: inf on every rank; 7e4 on one rank alone stays finite."""
    (m, n), reports = run
    xs = np.array([r["wide"] for r in reports], np.float64)
    exact, bound = xs.sum(axis=0), 4 * eps * np.abs(xs).sum(axis=0) + 16 * 2.0 ** -24
    for name in ("dense", "2dtar"):
        first = reports[0][f"{name}:{compression}"]["result"]
        for r in reports:
            assert r[f"{name}:{compression}"]["result"] == first   # bit-identical
            assert r[f"{name}:{compression}:graph"] == first
        got = np.array(first)
        finite = slice(1, None) if compression == "fp16" else slice(0, None)
        assert np.all(np.abs(got[finite] - exact[finite]) <= bound[finite]), name
        assert np.max(np.abs(got - exact)[3:]) > 0   # it did round
        if compression == "fp16":
            assert got[0] == np.inf and np.isfinite(got[1]) and abs(got[1] - 7e4) <= 7e4 * eps
        counted = {link: sum(r[f"{name}:{compression}"]["bytes"][link] for r in reports) for link in L.LINKS}
        full = {link: sum(r[f"{name}:none"]["bytes"][link] for r in reports) for link in L.LINKS}
        formula = ALGORITHMS[name].sent_bytes(D, m, n, 1, {"compression": compression})
        assert counted == pytest.approx({k: 4 * v for k, v in formula.items()}, rel=1e-12)
        assert sum(counted.values()) == pytest.approx(sum(full.values()) / 2, rel=0.01)


def test_compression_by_hand():
    # 2x2, d = 1M: dense's ring halves; bf16 on the world set is reduce-scatter + all-gather
    assert ALGORITHMS["dense"].sent_bytes(1_000_000, 2, 2, 0.01, {"compression": "fp16"}) == \
        {"intra": 1.5e6, "inter": 1.5e6}
    assert ALGORITHMS["2dtar"].sent_bytes(1_000_000, 2, 2, 0.01, {"compression": "bf16"}) == \
        {"intra": 2e6, "inter": 1e6}
    assert ALGORITHMS["dense"].sent_bytes(1_000_000, 2, 2, 0.01, {"compression": "bf16"}) == \
        {"intra": 0.75e6 + 0.5e6, "inter": 0.75e6 + 1e6}   # ring half across; 1 of 3 copies intra
    for name in ("dense", "2dtar"):
        full = collectives.predict(name, 25_000_000, 2, 2, 0.01)
        assert collectives.predict(name, 25_000_000, 2, 2, 0.01, options={"compression": "fp16"}) < full
    assert with_compression(None, "none") == {}
    assert with_compression({"dense": {"compression": "none"}}, "bf16") == \
        {"dense": {"compression": "none"}, "2dtar": {"compression": "bf16"}}
    agg = GradientAggregator("hitopk", compression="fp16", topology=object())   # not built
    assert agg.algorithm_options["2dtar"] == {"compression": "fp16"}
    for bad in ("fp8", None, 16):
        with pytest.raises(ValueError, match="^compression must be one of"):
            GradientAggregator("dense", compression=bad)
        with pytest.raises(ValueError, match="^compression must be one of"):
            DistributedOptimizer(keras.optimizers.SGD(0.1), compression=bad)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), compression="bf16")
    assert DistributedOptimizer.from_config(opt.get_config()).compression == "bf16"


def test_powersgd_formulas_by_hand():
    # d = 1M: a 1000 x 1000 matrix, rank 4: two allreduces of 4000 floats (2dtar on 2x2)
    got = ALGORITHMS["powersgd"].sent_bytes(1_000_000, 2, 2, 0.01)
    assert got == L.add(*[ALGORITHMS["2dtar"].sent_bytes(4000, 2, 2, 1)] * 2) == {"intra": 32_000, "inter": 16_000}
    assert ALGORITHMS["powersgd"].sent_bytes(1000, 1, 4, 0.01) == ALGORITHMS["dense"].sent_bytes(1000, 1, 4, 1)
    assert powersgd.shape(1500) == (39, 39) and powersgd.shape(1_000_000) == (1000, 1000)
    assert powersgd.residual_size(1_000_000, None) == 1_000_000 + 4 * 1000
    assert powersgd.residual_size(100, None) == 100   # too small: no Q
    # rank 600 would send more than the matrix: dense
    assert not powersgd.compressed(1_000_000, {"rank": 600, "min_compression_size": 1})
    # auto weighs it: on a 10 Mbit/s inter link at 25M entries the factors beat 1 % top-k; at
    # the default 10 Gbit/s its four passes of rank multiply-adds do not
    slow = alphabeta.LinkParams(beta_inter=8 / 0.01e9)
    assert collectives.choose(25_000_000, 2, 2, 0.01, slow) == "powersgd"
    assert collectives.choose(25_000_000, 2, 2, 0.01) != "powersgd"
