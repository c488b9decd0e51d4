"""PowerSGD (collectives/powersgd.py) and 16-bit values on the wire (collectives/wire.py): numpy
references on 4 ranks (2x2 and 1x4), bit-identical replicas, bytes moved against the formulas, and
the options and arguments by hand."""

import keras
import numpy as np
import pytest

from tests import hvdrun
from tf_commlib import alphabeta, collectives
from tf_commlib import link_bytes
from tf_commlib.aggregator import GradientAggregator
from tf_commlib.collectives import ALGORITHMS, powersgd, with_compression
from tf_commlib.keras import DistributedOptimizer

# tests/workers/powersgd_worker.py's bucket: (shape, matrix rows x cols if compressed) by hand
SHAPES = [(3, 3, 4, 8), (30,), (20, 30), (4, 5), (2, 100)]
MATRICES = {0: (36, 8), 2: (20, 30)}   # the bias is a vector, (4, 5) < 64 entries, (2, 100): 306 > 200
SIZES = [int(np.prod(s)) for s in SHAPES]
OFFSETS = np.cumsum([0] + SIZES)
D, STEPS, RANK = sum(SIZES), 3, 3


def gram_schmidt(p):
    p = p.copy()
    for i in range(p.shape[1]):
        for j in range(i):
            p[:, i] -= (p[:, j] @ p[:, i]) * p[:, j]
        norm = np.linalg.norm(p[:, i])
        p[:, i] = p[:, i] / norm if norm > 0 else 0
    return p


def ref_step(xs, res, qs):
    """One call on every rank: (result, residual per rank, Q per compressed tensor), float64; the
    uncompressed tensors summed exactly (zero residual), each matrix by one power step from qs[t]."""
    ms = [x + r for x, r in zip(xs, res)]
    result, left, q_new = np.sum(ms, axis=0), [np.zeros(D) for _ in xs], {}
    for t, (rows, cols) in MATRICES.items():
        part = slice(OFFSETS[t], OFFSETS[t + 1])
        mats = [m[part].reshape(rows, cols) for m in ms]
        p = gram_schmidt(sum(mat @ qs[t] for mat in mats))
        q_mine = [mat.T @ p for mat in mats]
        q_new[t] = sum(q_mine)
        result[part] = (p @ q_new[t].T).ravel()
        for w, (mat, qw) in enumerate(zip(mats, q_mine)):
            left[w][part] = (mat - p @ qw.T).ravel()
    return result, left, q_new


def powersgd_ref(inputs, q0, warm=True):
    """inputs[step][rank] -> per step (Q of each compressed tensor, result, residuals per rank);
    warm=False starts every step from q0 (what the warm start must differ from)."""
    res, qs, steps = [np.zeros(D) for _ in inputs[0]], dict(q0), []
    for xs in inputs:
        result, res, q_new = ref_step(xs, res, qs if warm else q0)
        qs = q_new
        steps.append((q_new, result, res))
    return steps


def q0_of(report, bucket):
    return {int(t): np.array(q, np.float64) for t, q in report["q0"][str(bucket)].items()}


def flat_q(qs):
    return np.concatenate([qs[t].ravel() for t in sorted(MATRICES)])


@pytest.fixture(scope="module", params=["2x2", "1x4"])
def run(request, tmp_path_factory, shared):
    m, n = map(int, request.param.split("x"))
    if "powersgd" in hvdrun.SHARED.get(request.param, {}):   # 1x4: in the shared job (tests/hvdrun.py SHARED)
        return (m, n), shared(request.param, "powersgd")
    return (m, n), hvdrun.run("powersgd_worker.py", 4, tmp_path_factory.mktemp(request.param),
                              topology=request.param)


def close(got, want, what):
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(np.array(got, np.float64), want, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


def test_powersgd_matches_numpy_and_replicas_are_identical(run):
    (m, n), reports = run
    inputs = [[np.array(r["inputs"][s], np.float64) for r in reports] for s in range(STEPS)]
    assert [tuple(t) for t in reports[0]["layout"]] == [(i, int(OFFSETS[i]), SIZES[i], *(MATRICES.get(i) or ((s[0], s[1]) if len(s) == 2 else (0, 0))),
          i in MATRICES) for i, s in enumerate(SHAPES)]
    q0 = q0_of(reports[0], 3)
    assert sorted(q0) == sorted(MATRICES) and all(q0[t].shape == (MATRICES[t][1], RANK) for t in q0)
    assert not np.allclose(q0[0], q0[2][:8])   # each tensor draws its own Q
    ref = powersgd_ref(inputs, q0)
    for r in reports:
        assert r["q0"] == reports[0]["q0"]   # the starting Q is the same on every rank
        for s, (q, result, res) in enumerate(ref):
            got = r["powersgd"][s]
            assert got["result"] == reports[0]["powersgd"][s]["result"]   # bit-identical
            assert got["q"] == reports[0]["powersgd"][s]["q"]
            close(got["result"], result, f"result step {s} rank {r['rank']}")
            close(got["q"], flat_q(q), f"Q step {s}")
            close(got["residual"], res[r["rank"]], f"residual step {s} rank {r['rank']}")
            for t in set(range(len(SHAPES))) - set(MATRICES):   # summed exactly: no residual
                assert not np.any(got["residual"][OFFSETS[t]:OFFSETS[t + 1]]), (s, t)
            assert got["sent"] == 0
    # warm start: each step starts from the last Q, which differs from restarting at q0
    cold = powersgd_ref(inputs, q0, warm=False)
    assert np.max(np.abs(cold[-1][1] - ref[-1][1])) > 1e-3 * np.max(np.abs(ref[-1][1]))
    # Q zeroed (reset, flush): drawn again from the seed, residual kept
    again = ref_step(inputs[0], ref[-1][2], q0)
    for r in reports:
        close(r["restart"]["result"], again[0], "restart result")
        close(r["restart"]["residual"], again[1][r["rank"]], "restart residual")
    # error feedback conserves mass; the approximation is not the exact sum
    total = sum(np.sum(xs, axis=0) for xs in inputs)
    approx = sum(np.array(reports[0]["powersgd"][s]["result"]) for s in range(STEPS))
    left = sum(np.array(r["powersgd"][-1]["residual"]) for r in reports)
    close(approx + left, total, "mass")
    assert np.linalg.norm(left) > 0.1 * np.linalg.norm(total)
    # the bytes moved: one allreduce of the 250 uncompressed entries, one of all P's ((36 + 20)·3),
    # one of all Q's ((8 + 30)·3): 2dtar on 2x2, dense on 1x4
    options = {"rank": RANK, "min_compression_size": 64}
    formula = ALGORITHMS["powersgd"].sent_bytes(D, m, n, 0.01, options, SHAPES)
    inner = ALGORITHMS["2dtar" if m > 1 else "dense"]
    assert formula == link_bytes.add(*[inner.sent_bytes(k, m, n, 1) for k in (250, 56 * RANK, 38 * RANK)])
    for s in range(STEPS):
        counted = {link: sum(r["powersgd"][s]["bytes"][link] for r in reports) for link in link_bytes.LINKS}
        assert counted == pytest.approx({k: 4 * v for k, v in formula.items()}, rel=1e-12)
    # no tensor compressed (all under min_compression_size, or no shapes: one flat vector): the
    # exact sum, the dense bytes, a zero state
    for name, options in (("small", {**options, "min_compression_size": 2 * D}), ("flat", options)):
        shapes = SHAPES if name == "small" else None
        for r in reports:
            close(r[f"powersgd_{name}"]["result"], np.sum(inputs[0], axis=0), f"{name}: the exact sum")
            assert not np.any(r[f"powersgd_{name}"]["state"])
            assert len(r[f"powersgd_{name}"]["state"]) == D
        counted = {link: sum(r[f"powersgd_{name}"]["bytes"][link] for r in reports) for link in link_bytes.LINKS}
        assert ALGORITHMS["powersgd"].sent_bytes(D, m, n, 0.01, options, shapes) == inner.sent_bytes(D, m, n, 1)
        assert counted == pytest.approx({k: 4 * v for k, v in inner.sent_bytes(D, m, n, 1).items()}, rel=1e-12)


def test_powersgd_through_the_aggregator(run):
    (m, n), reports = run
    inputs = [[np.array(r["inputs"][s], np.float64) for r in reports] for s in range(STEPS)]
    ref = powersgd_ref(inputs, q0_of(reports[0], 0))
    assert reports[0]["graph_buckets"] == 1
    for r in reports:
        for s, (_, result, res) in enumerate(ref):
            assert r["graph"][s]["result"] == reports[0]["graph"][s]["result"]
            close(r["graph"][s]["result"], result, f"aggregator step {s}")
        close(r["graph_state"][:D], ref[-1][2][r["rank"]], "aggregator residual")
        close(r["graph_state"][D:], flat_q(ref[-1][0]), "aggregator Q")
    assert reports[0]["graph_formula"] == ALGORITHMS["powersgd"].sent_bytes(
        D, m, n, 0.01, {"rank": RANK, "min_compression_size": 64}, SHAPES)
    for s in range(STEPS):
        counted = {link: sum(r["graph"][s]["bytes"][link] for r in reports) for link in link_bytes.LINKS}
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
        counted = {link: sum(r[f"{name}:{compression}"]["bytes"][link] for r in reports) for link in link_bytes.LINKS}
        full = {link: sum(r[f"{name}:none"]["bytes"][link] for r in reports) for link in link_bytes.LINKS}
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
    agg = GradientAggregator("hitopk", algorithm_options=with_compression(None, "fp16"), topology=object())
    assert agg.algorithm_options["2dtar"] == {"compression": "fp16"}
    for bad in ("fp8", None, 16):
        with pytest.raises(ValueError, match="^compression must be one of"):
            GradientAggregator("dense", algorithm_options=with_compression(None, bad))
        with pytest.raises(ValueError, match="^compression must be one of"):
            DistributedOptimizer(keras.optimizers.SGD(0.1), compression=bad)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), compression="bf16")
    assert DistributedOptimizer.from_config(opt.get_config()).compression == "bf16"


def test_powersgd_formulas_by_hand():
    # a 1000 x 1000 kernel and a bias of 1000, rank 4: allreduces of the bias and of 4000 floats
    # for P and for Q (2dtar on 2x2)
    two_d, shapes = ALGORITHMS["2dtar"], [(1000, 1000), (1000,)]
    got = ALGORITHMS["powersgd"].sent_bytes(1_001_000, 2, 2, 0.01, shapes=shapes)
    assert got == link_bytes.add(two_d.sent_bytes(1000, 2, 2, 1), *[two_d.sent_bytes(4000, 2, 2, 1)] * 2) == \
        {"intra": 36_000, "inter": 18_000}
    # no bias: the P and Q allreduces only; a conv kernel is (kh·kw·in) x out
    assert ALGORITHMS["powersgd"].sent_bytes(1_000_000, 2, 2, 0.01, shapes=[(1000, 1000)]) == \
        {"intra": 32_000, "inter": 16_000}
    conv = [(3, 3, 64, 128)]   # 576 x 128: P of 576·4, Q of 128·4
    assert ALGORITHMS["powersgd"].sent_bytes(73728, 1, 4, 0.01, shapes=conv) == \
        link_bytes.add(ALGORITHMS["dense"].sent_bytes(576 * 4, 1, 4, 1),
                       ALGORITHMS["dense"].sent_bytes(128 * 4, 1, 4, 1))
    assert powersgd.matrix_shape((3, 3, 64, 128)) == (576, 128) and powersgd.matrix_shape((7,)) is None
    # without shapes a bucket is one vector: summed exactly, no Q
    assert ALGORITHMS["powersgd"].sent_bytes(1_000_000, 2, 2, 0.01) == two_d.sent_bytes(1_000_000, 2, 2, 1)
    resolved = ALGORITHMS["powersgd"].formula_options
    assert powersgd.state_size(1_000_000, None) == 1_000_000
    assert powersgd.state_size(1_001_000, None, resolved(None, shapes, 1_001_000)) == 1_001_000 + 4 * 1000
    assert powersgd.state_size(100, None, resolved(None, [(10, 10)], 100)) == 100   # too small: no Q
    # rank 600 would send more than the matrix: dense
    assert powersgd.state_size(1_000_000, None, resolved({"rank": 600, "min_compression_size": 1},
                                                            [(1000, 1000)], 1_000_000)) == 1_000_000
    with pytest.raises(ValueError, match="^shapes must be"):
        ALGORITHMS["powersgd"].sent_bytes(1000, 2, 2, 0.01, shapes=[(10, 10)])
    with pytest.raises(ValueError, match="^shapes must be"):
        ALGORITHMS["powersgd"].breakdown(100, 2, 2, 0.01, shapes=[(10, -10)])
    # auto weighs it: on a 10 Mbit/s inter link, a bucket of five 2236 x 2236 kernels (25M entries)
    # is cheapest as PowerSGD's factors; at the default 10 Gbit/s its four passes of rank
    # multiply-adds do not pay; a flat vector never compresses
    slow, kernels = alphabeta.LinkParams(beta_inter=8 / 0.01e9), [(2236, 2236)] * 5
    assert collectives.choose(5 * 2236 ** 2, 2, 2, 0.01, slow, shapes=kernels) == "powersgd"
    assert collectives.choose(5 * 2236 ** 2, 2, 2, 0.01, shapes=kernels) != "powersgd"
    assert collectives.choose(25_000_000, 2, 2, 0.01, slow) != "powersgd"
