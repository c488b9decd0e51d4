"""AR-Topk (tyagi): star, var, star_hier and var_hier inside tf.function against a numpy reference
of the paper's algorithm, bit-for-bit on every rank, for several steps (STAR's root moving with
the step), on 2x2, 3x1 and 5 ranks flat (1x5); density 1.0 equals dense; error feedback conserves
mass; the bytes moved in every step equal each collective's formula.

One node of 4 ranks (1x4) is not run here: 1x5 is the same case (one node, the flat variants over
its ranks, the hier ones with one-rank inter sets and a short last shard of each bucket) with one
rank more, and the tiny tensor's short and empty shards, which 1x4 alone had with d = 5, come on
1x5 with d = 7. tests/test_collectives.py still checks star/var's bytes on 1x4."""
import math

import numpy as np
import pytest

from tests import hvdrun
from tests import reference as ref
from tests.test_collectives import check_sparcml_extras, check_sparcml_steps
from tf_commlib import link_bytes
from tf_commlib.collectives import ALGORITHMS

NAMES, DENSITIES, SEED = ("star", "var", "star_hier", "var_hier"), (0.05, 1.0), 11
SHAPES, THRESHOLD = [(601,), (20, 20)], 4 * 601   # tests/workers/artopk_worker.py's: two buckets


def bucket_slices():
    """Per bucket of the aggregator's plan (bucket i at place i): the index of each of its entries
    in the concatenated gradients (the worker's inputs and results)."""
    import tensorflow as tf
    from tf_commlib import fusion

    offsets = np.cumsum([0] + [math.prod(s) for s in SHAPES])
    plan = fusion.plan([tf.TensorSpec(s, tf.float32) for s in SHAPES], THRESHOLD)
    return [np.concatenate([np.arange(offsets[p], offsets[p + 1]) for p in b.positions]) for b in plan]


def select(x, k, seed, rank, size):
    """The indices mstopk selects with the aggregator's per-rank seed."""
    return ref.mstopk(x, k, seed=seed * size + rank)[0] if len(x) else np.zeros(0, int)


def root_of(variant, step, fused, chosen):
    """STAR: step mod N; VAR: the largest ||top-k values||^2, ties to the lowest; "root0": always 0
    (what STAR would do if the step did not reach it)."""
    if variant in ("star", "root0"):
        return step % len(fused) if variant == "star" else 0
    norms = [np.sum(np.square(f[c].astype(np.float64))) for f, c in zip(fused, chosen)]
    return int(np.flatnonzero(norms == np.max(norms))[0])


def ar_topk_round(fused, real, k, variant, step, ranks, size, bucket):
    """One AR-Topk round over the set whose members hold `fused` (selection among [:real]):
    (the root's indices, their sum over the set, the members' new residuals)."""
    seed = SEED + step * 1_000_003 + bucket * 7919   # GradientAggregator's
    chosen = [select(f[:real], k, seed, r, size) for f, r in zip(fused, ranks)]
    idx = chosen[root_of(variant, step, fused, chosen)]
    total = np.zeros(len(idx), np.float32)
    for f in fused:
        total += f[idx]
    residuals = [f.copy() for f in fused]
    for rv in residuals:
        rv[idx] = 0
    return idx, total, residuals


def flat_ref(inputs, density, variant, bucket):
    """inputs[step][rank] -> (result per step, residual per rank)."""
    size, d = len(inputs[0]), len(inputs[0][0])
    res = [np.zeros(d, np.float32) for _ in range(size)]
    k, results = max(1, math.ceil(density * d)), []
    for step, xs in enumerate(inputs):
        idx, total, res = ar_topk_round([x + r for x, r in zip(xs, res)], d, k, variant, step, range(size), size,
                                      bucket)
        out = np.zeros(d, np.float32)
        out[idx] = total
        results.append(out)
    return results, res


def hier_ref(inputs, density, variant, m, n, bucket):
    """Intra reduce-scatter, AR-Topk over the nodes on each shard, allgather: (results, {(i, j): residual})."""
    d = len(inputs[0][0])
    s = math.ceil(d / n)
    res = {(i, j): np.zeros(s, np.float32) for i in range(m) for j in range(n)}
    k, results = max(1, math.ceil(density * d / n)), []
    for step, xs in enumerate(inputs):
        padded = [np.concatenate([x, np.zeros(n * s - d, np.float32)]) for x in xs]
        full = np.zeros(n * s, np.float32)
        for j in range(n):
            real = max(0, min(s, d - j * s))
            fused = [np.sum([padded[i * n + q][j * s:(j + 1) * s] for q in range(n)], axis=0) + res[(i, j)]
                     for i in range(m)]
            idx, total, new = ar_topk_round(fused, real, k, variant, step, [i * n + j for i in range(m)], m * n,
                                            bucket)
            full[j * s + idx] = total
            res.update({(i, j): new[i] for i in range(m)})
        results.append(full[:d])
    return results, res


def reference(name, inputs, density, m, n, bucket=0):
    """One bucket: (results, residual of each rank in rank order, the residuals summed at their place)."""
    variant, _, hier = name.partition("_")
    if not hier:
        results, res = flat_ref(inputs, density, variant, bucket)
        return results, res, np.sum(res, axis=0)
    results, res = hier_ref(inputs, density, variant, m, n, bucket)
    d, s = len(inputs[0][0]), math.ceil(len(inputs[0][0]) / n)
    left = np.zeros(n * s, np.float32)
    for (i, j), rv in res.items():
        left[j * s:(j + 1) * s] += rv
    return results, [res[divmod(r, n)] for r in range(m * n)], left[:d]


@pytest.mark.parametrize("layout", ["2x2", "3x1", "flat5"])
def test_ar_topk_matches_numpy_on_every_rank(layout, tmp_path, shared):
    ranks = 5 if layout == "flat5" else math.prod(map(int, layout.split("x")))
    if "artopk" in hvdrun.SHARED.get(layout, {}):   # 3x1: in the shared job (tests/hvdrun.py SHARED)
        reports = shared(layout, "artopk")
    else:
        reports = hvdrun.run("artopk_worker.py", ranks, tmp_path, topology=None if layout == "flat5" else layout,
                             timeout=400)
    m, n = reports[0]["m"], reports[0]["n"]
    assert m * n == ranks
    if layout == "flat5":   # SparCML folding 5 ranks onto 4, in this launch (tests/workers/_sparcml.py)
        sparcml = [r["sparcml"] for r in reports]
        check_sparcml_steps(sparcml, m, n)
        check_sparcml_extras(sparcml, layout)
    steps = len(reports[0]["inputs"])
    inputs = [[np.array(r["inputs"][step], np.float32) for r in reports] for step in range(steps)]
    dense = [np.sum(xs, axis=0) for xs in inputs]
    total_in = np.sum(dense, axis=0)
    for name in NAMES:
        for density in DENSITIES:
            key = f"{name}@{density}"
            want, left = np.zeros((steps, len(total_in)), np.float32), np.zeros(len(total_in), np.float32)
            for b, where in enumerate(bucket_slices()):
                results, want_res, bucket_left = reference(name, [[x[where] for x in xs] for xs in inputs], density,
                                                           m, n, b)
                want[:, where] = np.array(results)
                left[where] = bucket_left
                for r in reports:
                    np.testing.assert_array_equal(r[key]["residuals"][b], want_res[r["rank"]], err_msg=f"{key} residual")
            for r in reports:   # bit-identical on every rank and step; no new trace while STAR's root moves
                assert r[key]["traces"][0] == r[key]["traces"][1], key
                np.testing.assert_array_equal(np.array(r[key]["results"], np.float32), want,
                                              err_msg=f"{key} rank {r['rank']} on {layout}")
            # error feedback conserves mass: aggregated + left in the residuals = what went in
            np.testing.assert_array_equal(np.sum(want, axis=0) + left, total_in, err_msg=key)
            if density == 1.0:
                np.testing.assert_array_equal(want, np.array(dense), err_msg=key)
            formula = [ALGORITHMS[name].sent_bytes(len(where), m, n, density) for where in bucket_slices()]
            for step in range(steps):   # the root moves; the bytes do not
                got = {link: sum(r[key]["sent"][step][link] for r in reports) for link in link_bytes.LINKS}
                assert got == pytest.approx({link: ranks * sum(f[link] for f in formula) for link in link_bytes.LINKS},
                                            rel=1e-12, abs=1e-9), f"{key} step {step} on {layout}"
    # the step reaches STAR: a root fixed at 0 would have given other sums
    for name in ("star", "star_hier") if m > 1 else ("star",):
        fixed = reference(name.replace("star", "root0"), [[x[:601] for x in xs] for xs in inputs], 0.05, m, n)[0]
        star = reference(name, [[x[:601] for x in xs] for xs in inputs], 0.05, m, n)[0]
        assert not np.array_equal(np.array(fixed), np.array(star)), name
    tiny = [np.arange(1, 8, dtype=np.float32) * (r + 1) for r in range(ranks)]
    for name in ("star_hier", "var_hier"):   # d = 7: a short shard (n = 2, 5) and (n = 5) an empty one
        want, want_res, _ = reference(name, [tiny], 0.5, m, n)
        for r in reports:
            np.testing.assert_array_equal(r[f"{name}@tiny"]["results"], want[0], err_msg=f"{name} tiny")
            np.testing.assert_array_equal(r[f"{name}@tiny"]["residual"], want_res[r["rank"]])


# tyagi Table VI, ResNet18 (M = 11689512 floats), alpha = 1 ms, 10 and 1 Gbit/s, N = 8:
# (1/beta in Gbit/s, c) -> (AG, ART-Ring, ART-Tree) in ms
TABLE_VI = {(10, 0.1): (54, 35, 43.2), (10, 0.01): (7.66, 18.1, 12.2), (10, 0.001): (3.28, 16.7, 9),
            (1, 0.1): (526.3, 194.7, 345.6), (1, 0.01): (51.93, 34.1, 41.9), (1, 0.001): (8.86, 19.5, 12.8)}


@pytest.mark.parametrize("gbit, c", sorted(TABLE_VI))
def test_tyagi_formulas_reproduce_table_vi(gbit, c):
    from tf_commlib.collectives import ar_topk
    mc, beta = 11689512 * 4 * c, 8 / (gbit * 1e9)
    got = [1e3 * f(mc, 8, 1e-3, beta) for f in (ar_topk.tyagi_ag, ar_topk.art_ring, ar_topk.art_tree)]
    assert got == pytest.approx(TABLE_VI[(gbit, c)], rel=0.08)


def test_star_and_var_time_is_art_ring():
    """The flat collectives' communication is ART-Ring on the world's link plus the length's
    broadcast (and VAR's norms); star_hier's ART-Ring runs among the m nodes on n shards at once."""
    from tf_commlib.collectives import ar_topk
    from tf_commlib.alphabeta import LinkParams
    params, d, density = LinkParams(), 1_000_000, 0.01
    k = math.ceil(density * d)
    for m, n in ((2, 2), (3, 1), (1, 4)):
        link = (params.alpha_inter, params.beta_inter) if m > 1 else (params.alpha_intra, params.beta_intra)
        star = ALGORITHMS["star"].breakdown(d, m, n, density, params)
        var = ALGORITHMS["var"].breakdown(d, m, n, density, params)
        assert star["art_ring"] == pytest.approx(ar_topk.art_ring(4 * k, m * n, *link))
        assert star["length"] == pytest.approx(math.log2(m * n) * (link[0] + 4 * link[1]))
        assert set(var) - set(star) == {"norms"} and var["art_ring"] == star["art_ring"]
    hier = ALGORITHMS["star_hier"].breakdown(d, 2, 2, density, params)
    assert hier["art_ring"] == pytest.approx(ar_topk.art_ring(4 * math.ceil(density * d / 2) * 2, 2,
                                                        params.alpha_inter, params.beta_inter))
