"""The alpha-beta cost model (tf_commlib.alphabeta, each collective's time formula, the predictions and
`auto` in tf_commlib.collectives, calibration in tf_commlib.costmodel):
hand-computed predictions, monotonicity, degenerate layouts, argmin choice over the registry,
options, and calibrate() agreeing on every rank of a 2x2 Horovod job."""
import dataclasses
import math

import numpy as np
import pytest

from tf_commlib import alphabeta, collectives
from tf_commlib.alphabeta import LinkParams
from tf_commlib.collectives import ALGORITHMS, choose, predict

ALGOS = list(ALGORITHMS)
# Round numbers so that the arithmetic below can be checked by hand.
PARAMS = LinkParams(alpha_intra=1e-5, beta_intra=1e-9, alpha_inter=1e-4, beta_inter=1e-8,
                    select_s_per_elem=2e-9, add_s_per_elem=5e-9, mem_s_per_elem=1e-9)
M, N, D, RHO = 2, 4, 1_000_000, 0.01   # P = 8, shard s = 250_000, k = 10_000, k~ = 2_500


def test_every_collective_module_is_registered():
    import importlib
    import pkgutil

    import tf_commlib.collectives as package
    modules = [importlib.import_module(f"tf_commlib.collectives.{i.name}")
               for i in pkgutil.iter_modules(package.__path__)]
    declared = [mod.COLLECTIVE for mod in modules if hasattr(mod, "COLLECTIVE")]
    assert {"dense", "2dtar", "naive_ag", "hitopk"} <= set(ALGORITHMS)
    assert sorted(c.name for c in declared) == sorted(ALGORITHMS)
    assert all(ALGORITHMS[c.name] is c for c in declared)


def test_dense_by_hand():
    # ring over P=8 on the inter link: 2*7*1e-4 + 2*7/8 * 4e6 B * 1e-8 = 1.4e-3 + 0.07
    assert predict("dense", D, M, N, RHO, PARAMS) == pytest.approx(0.0714, rel=1e-12)


def test_2dtar_by_hand():
    rs = 3 * 1e-5 + 3 / 4 * 4e6 * 1e-9           # eq. (7): 3e-5 + 3e-3
    inter = 2 * 1 * 1e-4 + 2 * 1 / 2 * 4e6 * 1e-8  # 4 streams of 1e6 B share the link: 2e-4 + 0.04
    ag = 3 * 1e-5 + 3 * 1e6 * 1e-9               # Gloo's ring: (n-1)*alpha + (n-1)*4s*beta: 3e-5 + 3e-3
    assert rs + inter + ag == pytest.approx(0.04626)
    assert predict("2dtar", D, M, N, RHO, PARAMS) == pytest.approx(0.04626, rel=1e-12)


def test_naive_ag_by_hand():
    select = 1e6 * 2e-9                          # 2e-3
    gather = 7 * 1e-4 + 7 * 8 * 10_000 * 1e-8    # eq. (3) as a ring of P-1 steps, 8-byte entries: 6.3e-3
    scatter = 1e6 * 1e-9 + 8 * 10_000 * 5e-9     # zero-fill d + P*k adds: 1e-3 + 4e-4
    residual = 1e6 * 1e-9 + 10_000 * 5e-9 + 1e6 * 1e-9   # scatter k into d, subtract: 2.05e-3
    assert select + gather + scatter + residual == pytest.approx(0.01175)
    assert predict("naive_ag", D, M, N, RHO, PARAMS) == pytest.approx(0.01175, rel=1e-12)


def test_hitopk_by_hand():
    t1 = 3 * 1e-5 + 3 / 4 * 4e6 * 1e-9           # eq. (7): 3.03e-3 (4 divides d: no pad)
    t2 = 250_000 * 2e-9                          # eq. (8): 5e-4
    t3 = 1 * 1e-4 + 1 * 4 * 2_500 * 8 * 1e-8     # eq. (9), 8-byte entries, 4 streams share the link: 9e-4
    # step 4, sparse (2*m*rho = 0.04 < 1): m*k~ = 5000 8-byte entries over n = 4 (eq. (10)),
    # a scatter-add of n*m*k~ = 20000 into d, the k~ sent indices gathered
    t4 = (3 * 1e-5 + 3 * 8 * 5_000 * 1e-9) + (1e6 * 1e-9 + 20_000 * 5e-9) \
        + (3 * 1e-5 + 3 * 4 * 2_500 * 1e-9)      # 1.5e-4 + 1.1e-3 + 6e-5 (ring allgathers: n-1 steps)
    residual = 250_000 * 1e-9 + 2_500 * 5e-9 + 250_000 * 1e-9   # 5.125e-4
    assert t1 + t2 + t3 + t4 + residual == pytest.approx(0.0062525)
    assert predict("hitopk", D, M, N, RHO, PARAMS) == pytest.approx(0.0062525, rel=1e-12)
    steps = collectives.breakdown("hitopk", D, M, N, RHO, PARAMS)
    assert list(steps) == ["reducescatter", "select", "inter_allgather", "intra_allgather", "residual"]
    assert steps["inter_allgather"] == pytest.approx(t3)
    assert steps["intra_allgather"] == pytest.approx(t4)


def test_sparcml_merges_by_hand():
    # P = 8 ranks, k = 10_000 of d = 1e6 each; a row merged costs 1 us. Every rank first merges its
    # own stream (k rows); SSAR round t merges its block's stream with the partner's block's, each
    # the union of 2^t streams: E = d(1 - (1 - k/d)^(2^t)) rows.
    params = dataclasses.replace(PARAMS, merge_s_per_elem=1e-6)
    k = 10_000
    union = [D * (1 - (1 - k / D) ** (2 ** t)) for t in range(3)]
    steps = collectives.breakdown("ssar_rd", D, M, N, RHO, params)
    assert steps["sort"] == pytest.approx(k * 1e-6, rel=1e-12)
    assert steps["merge"] == pytest.approx(2 * sum(union) * 1e-6, rel=1e-12)   # ~0.0594 s
    # the split variants: owner j merges the slice-j part of all 8 streams (its own included): the
    # expected k·8·(d/8)/d = k rows
    split = collectives.breakdown("ssar_split_ag", D, M, N, RHO, params)
    assert split["merge"] == pytest.approx(8 * (D / 8) * k / D * 1e-6, rel=1e-12)
    # folding (P = 5 onto 4): rank 0 merges its stream with rank 4's (2k); round 0: rank 0 merges
    # {0, 4} with {1}; round 1: {0, 4, 1} with {2, 3}
    u = [D * (1 - (1 - k / D) ** j) for j in range(4)]
    folded = collectives.breakdown("ssar_rd", D, 5, 1, RHO, params)
    assert folded["merge"] == pytest.approx((2 * k + (u[2] + k) + (u[3] + u[2])) * 1e-6, rel=1e-12)
    # the merges are what makes SSAR's rounds dearer than the split phase at P = 8
    assert steps["merge"] > 5 * split["merge"]
    # a rank's own part is merged, not sent: rounds 0 and 1 stay inside a node of 4, round 2 crosses
    sent = ALGORITHMS["ssar_rd"].sent_bytes(D, M, N, RHO)
    assert sent["intra"] == pytest.approx(8 * (union[0] + union[1]), rel=1e-12)
    assert sent["inter"] == pytest.approx(8 * union[2], rel=1e-12)


def test_copies_by_hand():
    # dsar_split_ag concatenates its decoded slices (a pass over d); hitopk and the hierarchical
    # AR-Topk pad x to n shards, a copy when n does not divide d (tf.pad forwards x otherwise)
    assert collectives.breakdown("dsar_split_ag", D, M, N, RHO, PARAMS)["concat"] == pytest.approx(D * 1e-9)
    for d, pad in ((D, 0.0), (D + 1, (D + 4) * 1e-9)):
        rs = pad + 3 * 1e-5 + 3 / 4 * 4 * (D + 4) * 1e-9 if d > D else 3 * 1e-5 + 3 / 4 * 4e6 * 1e-9
        for algo in ("hitopk", "star_hier", "var_hier"):
            assert collectives.breakdown(algo, d, M, N, RHO, PARAMS)["reducescatter"] == pytest.approx(rs, rel=1e-12)


def test_ready_fetches_one_element_of_each_output():
    import numpy as np
    import tensorflow as tf

    from tf_commlib.timing import ready
    out = ready((tf.range(5.0), {"i": tf.zeros([0], tf.int32), "s": tf.constant(3)}, tf.ones([2, 3])))
    assert out[0].tolist() == [0.0] and out[1]["i"].size == 0 and out[1]["s"] == 3
    assert isinstance(out[2], np.ndarray) and out[2].tolist() == [1.0]


def test_hitopk_step4_is_dense_at_high_density():
    # 2*m*rho = 1.2 >= 1: scatter-add of m*k~ = 150000 into s, gather the 4*s bytes shards
    k = 75_000
    t4 = (250_000 * 1e-9 + 2 * k * 5e-9) + (3 * 1e-5 + 3 * 4 * 250_000 * 1e-9) + (3 * 1e-5 + 3 * 4 * k * 1e-9)
    steps = collectives.breakdown("hitopk", D, M, N, 0.3, PARAMS)
    assert steps["intra_allgather"] == pytest.approx(t4, rel=1e-12)
    # the option step4 forces a branch; the prediction follows it
    forced = collectives.breakdown("hitopk", D, M, N, 0.3, PARAMS, options={"step4": "sparse"})
    t4_sparse = (3 * 1e-5 + 3 * 8 * 2 * k * 1e-9) + (1e6 * 1e-9 + 4 * 2 * k * 5e-9) + (3 * 1e-5 + 3 * 4 * k * 1e-9)
    assert forced["intra_allgather"] == pytest.approx(t4_sparse, rel=1e-12)
    # at 1 % the dense branch: scatter-add of m*k~ = 5000 into s, the 4*s-byte shards, k~ indices
    t4_dense = (250_000 * 1e-9 + 5_000 * 5e-9) + (3 * 1e-5 + 3 * 1e6 * 1e-9) + (3 * 1e-5 + 3 * 4 * 2_500 * 1e-9)
    dense4 = collectives.breakdown("hitopk", D, M, N, RHO, PARAMS, options={"step4": "dense"})
    assert dense4["intra_allgather"] == pytest.approx(t4_dense, rel=1e-12)
    assert predict("hitopk", D, M, N, RHO, PARAMS, options={"step4": "auto"}) == predict("hitopk", D, M, N, RHO, PARAMS)
    # auto sees the options it is given
    opts = {"hitopk": {"step4": "dense"}}
    assert collectives.choose(D, M, N, RHO, PARAMS, ["hitopk"], options=opts) == "hitopk"
    costs = {a: predict(a, D, M, N, RHO, PARAMS, opts.get(a)) for a in ALGOS}
    assert choose(D, M, N, RHO, PARAMS, options=opts) == min(ALGOS, key=costs.get)


@pytest.mark.parametrize("options,message", [
    ({"step4": "maybe"}, r"step4.*must be one of"),
    ({"stepfour": "dense"}, r"unknown option\(s\) \['stepfour'\]"),
    ("dense", "must be a dict"),
])
def test_bad_options_raise(options, message):
    with pytest.raises(ValueError, match=message):
        predict("hitopk", D, M, N, RHO, PARAMS, options=options)
    with pytest.raises(ValueError, match=message):
        ALGORITHMS["hitopk"].sent_bytes(D, M, N, RHO, options)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("layout", [(2, 4), (4, 2), (16, 8), (1, 4), (4, 1)])
def test_monotone_in_d(algo, layout):
    m, n = layout
    times = [predict(algo, d, m, n, RHO, PARAMS) for d in (2**10, 2**14, 2**18, 2**22, 2**26)]
    assert all(a < b for a, b in zip(times, times[1:])), times


def test_hitopk_beats_naive_ag_on_a_slow_inter_link():
    slow = LinkParams(alpha_intra=1e-5, beta_intra=8 / 100e9, alpha_inter=1e-4, beta_inter=8 / 1e9,
                      select_s_per_elem=1e-9, add_s_per_elem=2e-9, mem_s_per_elem=2.5e-10)
    for m, n in [(2, 2), (2, 4), (16, 8)]:
        for d in (2**20, 25_000_000, 2**26):
            assert predict("hitopk", d, m, n, 0.01, slow) < predict("naive_ag", d, m, n, 0.01, slow)
    # the paper's testbed (16 x 8, 25M, 1 %): several times cheaper, and far below dense
    h = predict("hitopk", 25_000_000, 16, 8, 0.01, slow)
    a = predict("naive_ag", 25_000_000, 16, 8, 0.01, slow)
    assert a > 5 * h
    assert predict("dense", 25_000_000, 16, 8, 0.01, slow) > 5 * h


def test_compute_curve_interpolates_in_log_size():
    curve = LinkParams(compute_curve=((1000, 1e-9, 4e-9, 2e-9), (100_000, 3e-9, 8e-9, 4e-9)))
    assert curve.compute(10) == (1e-9, 4e-9, 2e-9)                  # constant below the first point
    assert curve.compute(10_000) == pytest.approx((2e-9, 6e-9, 3e-9))  # halfway in log(size)
    assert curve.compute(10**9) == (3e-9, 8e-9, 4e-9)               # and beyond the last
    assert PARAMS.compute(10_000) == (2e-9, 5e-9, 1e-9)              # no curve: the scalars
    # select_cost and scatter_add_cost follow the curve at the size of the array they touch
    assert alphabeta.select_cost(10_000, curve) == pytest.approx(10_000 * 2e-9)
    assert alphabeta.scatter_add_cost(100, 10_000, curve) == pytest.approx(10_000 * 3e-9 + 100 * 6e-9)


@pytest.mark.parametrize("params", [PARAMS, LinkParams()])
def test_choose_is_the_argmin(params):
    for m, n in [(1, 1), (1, 4), (4, 1), (2, 2), (2, 4), (16, 8)]:
        for d in (1, 100, 2**16, 2**20, 25_000_000):
            for rho in (0.001, 0.01, 0.1, 1.0):
                costs = {a: predict(a, d, m, n, rho, params) for a in ALGOS}
                assert choose(d, m, n, rho, params) == min(ALGOS, key=costs.get)
                assert costs[choose(d, m, n, rho, params)] == min(costs.values())
                for pair in [("dense", "2dtar"), ("naive_ag", "hitopk")]:
                    assert choose(d, m, n, rho, params, candidates=pair) == min(pair, key=costs.get)


def test_choose_follows_the_link():
    # 2x2, 25M floats: a fast inter link makes dense best, a slow one a lossy collective
    fast = LinkParams(beta_inter=8 / 100e9, beta_intra=8 / 100e9, select_s_per_elem=5e-9)
    slow = LinkParams(beta_inter=8 / 0.5e9, beta_intra=8 / 5e9)
    assert choose(25_000_000, 2, 2, 0.01, fast) == "dense"
    assert ALGORITHMS[choose(25_000_000, 2, 2, 0.01, slow)].lossy


def test_lossy_margin_keeps_exact_collectives_unless_a_sparse_one_is_much_faster():
    # 2x2, 1M floats: as the inter-node link slows, the lossy collectives' lead over the exact
    # ones grows; lossy_margin=0.5 switches to a sparse one only once it takes at most half the time
    seen = set()
    for mbit in np.geomspace(100_000, 5, 60):
        params = LinkParams(beta_inter=8 / (mbit * 1e6))
        costs = {a: predict(a, 1_000_000, 2, 2, 0.01, params) for a in ALGOS}
        best, exact = min(ALGOS, key=costs.get), min(("dense", "2dtar"), key=costs.get)
        picked = choose(1_000_000, 2, 2, 0.01, params, lossy_margin=0.5)
        assert picked == (best if costs[best] <= 0.5 * costs[exact] else exact), mbit
        assert choose(1_000_000, 2, 2, 0.01, params, lossy_margin=1.0) == best
        seen.add((ALGORITHMS[best].lossy, ALGORITHMS[picked].lossy))
    # the margin mattered somewhere (sparse predicted fastest, exact picked), and sparse still wins on slow links
    assert (True, False) in seen and (True, True) in seen, seen
    # only sparse candidates: the margin has nothing to compare against
    pair = ("hitopk", "naive_ag")
    costs = {a: predict(a, 1_000_000, 2, 2, 0.01) for a in pair}
    assert choose(1_000_000, 2, 2, 0.01, candidates=pair, lossy_margin=0.1) == min(pair, key=costs.get)
    for bad in (0, -1, 1.01, "0.5", True, None):
        with pytest.raises(ValueError, match="lossy_margin must be a number in"):
            choose(1000, 2, 2, 0.01, lossy_margin=bad)


def test_keep_exact_applies_the_margin_to_the_overlapped_step():
    params = LinkParams(beta_inter=8 / 10e6)   # 10 Mbit/s between nodes: sparse wins per bucket
    buckets = [(250_000, None), (120_000, [(400, 300)]), (5_000, None)]
    exact = chosen = 0.0
    for d, shapes in buckets:
        exact += min(predict(a, d, 2, 2, 0.01, params, None, shapes) for a in ("dense", "2dtar"))
        pick = choose(d, 2, 2, 0.01, params, shapes=shapes, lossy_margin=0.5)
        chosen += predict(pick, d, 2, 2, 0.01, params, None, shapes)
    assert chosen < 0.5 * exact   # without compute in the step, the per-bucket choice stands
    assert not collectives.keep_exact(buckets, 2, 2, 0.01, 0.0, params)
    # step = max(compute, communication): compressing pays only while it halves the step
    edge = (0.5 * exact)   # compute at which the sparse step max(c, chosen) = c is half the exact one
    assert not collectives.keep_exact(buckets, 2, 2, 0.01, edge * 0.99, params)
    assert collectives.keep_exact(buckets, 2, 2, 0.01, edge * 1.01, params)
    assert collectives.keep_exact(buckets, 2, 2, 0.01, exact * 3, params)   # communication hidden
    assert not collectives.keep_exact(buckets, 2, 2, 0.01, None, params)      # not known
    # margin 1.0: any predicted gain in the step; with compute above both, none
    assert not collectives.keep_exact(buckets, 2, 2, 0.01, edge * 1.01, params, lossy_margin=1.0)
    assert collectives.keep_exact(buckets, 2, 2, 0.01, exact * 1.01, params, lossy_margin=1.0)
    for bad in (-1.0, float("inf"), float("nan"), "1", True):
        with pytest.raises(ValueError, match="compute_s must be None or a finite number of seconds"):
            collectives.keep_exact(buckets, 2, 2, 0.01, bad, params)


def test_compute_seconds_on_one_process_restores_the_statistics():
    import keras
    import tensorflow as tf

    from tf_commlib import costmodel
    from tf_commlib.topology import Topology

    alone = Topology(m=1, n=1, rank=0, node=0, local=0, intra_ranks=(0,), inter_ranks=(0,))
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(64, 3),
                              keras.layers.BatchNormalization(), keras.layers.Flatten(), keras.layers.Dense(10)])
    x, y = tf.random.stateless_normal((64, 32, 32, 3), (1, 2)), tf.one_hot(tf.range(64) % 10, 10)
    loss = keras.losses.CategoricalCrossentropy(from_logits=True)
    before = [v.numpy() for v in model.non_trainable_variables]
    seconds = costmodel.compute_seconds(alone, model, x, y, loss, repeats=3)
    assert 0 < seconds < 60
    # forward+backward of 16x the batch takes longer (a forward alone or a constant would not)
    big_x, big_y = tf.tile(x, [16, 1, 1, 1]), tf.tile(y, [16, 1])
    assert costmodel.compute_seconds(alone, model, big_x, big_y, loss, repeats=3) > 2 * seconds
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.non_trainable_variables))
    for kwargs, message in ((dict(repeats=0), "repeats must be an int >= 1"),
                            (dict(loss="mse"), "loss must be callable"),
                            (dict(model=3), "model must be a Keras model"),
                            (dict(model=lambda x, training: x), "model must be a Keras model"),
                            (dict(topo=None), "topo must be a tf_commlib topology")):
        args = {**dict(topo=alone, model=model, x=x, y=y, loss=loss), **kwargs}
        with pytest.raises(ValueError, match=message):
            costmodel.compute_seconds(**args)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("m,n", [(1, 1), (1, 2), (2, 1), (1, 8), (8, 1)])
def test_degenerate_layouts_are_finite(algo, m, n):
    for d in (1, 3, 1000, 2**24):
        for rho in (1e-6, 0.01, 1.0):
            t = predict(algo, d, m, n, rho, PARAMS)
            assert math.isfinite(t) and t >= 0
    if m * n == 1 and algo in ("dense", "2dtar"):
        assert predict(algo, 2**20, m, n, 0.01, PARAMS) == 0.0   # nothing to communicate
    if m == 1:   # no inter-node term at all
        assert predict(algo, 2**20, m, n, 0.01, PARAMS) == \
            predict(algo, 2**20, m, n, 0.01, dataclasses.replace(PARAMS, beta_inter=1.0, alpha_inter=1.0))


def test_bad_arguments():
    with pytest.raises(ValueError):
        predict("ring", 10, 2, 2, 0.01)
    with pytest.raises(ValueError):
        predict("dense", 0, 2, 2, 0.01)
    with pytest.raises(ValueError):
        predict("hitopk", 10, 2, 2, 0.0)


def test_params_round_trip():
    assert LinkParams.from_list(PARAMS.as_list()) == PARAMS
    curved = dataclasses.replace(PARAMS, compute_curve=((2**20, 1e-9, 2e-9, 3e-9), (2**24, 4e-9, 5e-9, 6e-9)))
    assert LinkParams.from_list(curved.as_list()) == curved


def test_sizes_for_follows_the_largest_bucket():
    from tf_commlib.costmodel import sizes_for

    # the small model's 1 MB buckets (262144 floats): compute at the bucket, links not below 256K/1M
    assert sizes_for(262_144) == {"sizes": (2**18, 2**20), "compute_sizes": (2**14, 2**16, 2**18)}
    assert sizes_for(300_000) == {"sizes": (2**18, 2**20), "compute_sizes": (2**15, 2**17, 2**19)}
    assert sizes_for(1) == {"sizes": (2**18, 2**20), "compute_sizes": (2**12, 2**14, 2**16)}
    # ResNet-50's largest kernel (2.4M floats) and beyond: calibrate's defaults are the ceiling
    assert sizes_for(2_359_296) == sizes_for(10**9) == {"sizes": (2**20, 2**22),
                                                         "compute_sizes": (2**18, 2**20, 2**22)}
    for bad in (0, -5, 2.5, True, "1"):
        with pytest.raises(ValueError, match="largest_bucket must be an int >= 1"):
            sizes_for(bad)


def test_calibrate_agrees_on_every_rank(shared):
    reports = shared("2x2", "calibrate")
    first = reports[0]
    assert (first["m"], first["n"]) == (2, 2)
    for r in reports:
        assert r["params"] == first["params"]        # bit-identical: one allreduce, same division
        assert r["choices"] == first["choices"]
        assert r["predicted"] == first["predicted"]
        assert r["compute_s"] == first["compute_s"] > 0   # the slowest rank's, on every rank
    assert len(first["params"]) == 8 + 2 * 4     # 8 scalars, then the compute curve at 2 sizes
    assert all(math.isfinite(v) and v > 0 for v in first["params"]), first["params"]
    assert [row[0] for row in first["curve"]] == [2**16, 2**18]
    assert first["params"][4:7] == first["curve"][-1][1:]   # the scalars are the largest size's
    assert all(c in ALGOS for c in first["choices"])
    # measured, not the defaults (this job has 2 ranks on each link)
    defaults = LinkParams().as_list()
    assert all(a != b for a, b in zip(first["params"], defaults)), first["params"]
