"""Every registered collective against a numpy reference (the one its module declares, see
reference_of), on every rank, for 2x2, 1x4 and 3x1, and the bytes its primitives moved on each link
against the bytes its module says it sends."""
import math
import sys

import numpy as np
import pytest

from tests import hvdrun
from tests import reference as ref
from tf_commlib import link_bytes
from tf_commlib.collectives import ALGORITHMS

D, STEPS = 1001, 3
SPARCML = ("ssar_rd", "ssar_split_ag", "dsar_split_ag")   # their extras (float order, QSGD)


def seed(step, rank):
    return 100 * step + rank


def naive_ag_ref(inputs, density, selections=None):
    """inputs[step][rank] -> (results per step, residual per rank); appends each step's indices
    selected per rank to `selections`."""
    size = len(inputs[0])
    res = [np.zeros(D, np.float32) for _ in range(size)]
    k = max(1, math.ceil(density * D))
    results = []
    for step, xs in enumerate(inputs):
        agg = np.zeros(D, np.float32)
        chosen = []
        for r in range(size):
            comp = xs[r] + res[r]
            idx = ref.mstopk(comp, k, seed=seed(step, r))[0]
            chosen.append(idx)
            np.add.at(agg, idx, comp[idx])
            res[r] = comp.copy()
            res[r][idx] = 0
        results.append(agg)
        if selections is not None:
            selections.append(chosen)
    return results, res


def hitopk_ref(inputs, density, m, n):
    s = math.ceil(D / n)
    res = {(i, j): np.zeros(s, np.float32) for i in range(m) for j in range(n)}
    k = max(1, math.ceil(density * D / n))
    results = []
    for step, xs in enumerate(inputs):
        padded = [np.concatenate([x, np.zeros(n * s - D, np.float32)]) for x in xs]
        full = np.zeros(n * s, np.float32)
        for j in range(n):
            real = max(0, min(s, D - j * s))
            summed = np.zeros(s, np.float32)
            for i in range(m):
                shard = sum(padded[i * n + q][j * s:(j + 1) * s] for q in range(n)) + res[(i, j)]
                idx = ref.mstopk(shard[:real], k, seed=seed(step, i * n + j))[0] if real else []
                np.add.at(summed, idx, shard[idx])
                res[(i, j)] = shard.copy()
                res[(i, j)][idx] = 0
            full[j * s:(j + 1) * s] = summed
        results.append(full[:D])
    return results, res


def sum_ref(inputs, density, m, n):
    """Dense collectives: the exact sum, nothing left behind."""
    return [np.sum(xs, axis=0) for xs in inputs], None


def topk_ref(inputs, density, m, n):
    """Sparse collectives: naive_ag's, every rank's top-k of x + residual summed (SparCML's too)."""
    return naive_ag_ref(inputs, density)


def shard_topk_ref(inputs, density, m, n):
    """hitopk's: the top-k of each rank's shard after the intra-node reduce-scatter; the residual
    per rank is its shard's."""
    results, res = hitopk_ref(inputs, density, m, n)
    return results, [res[divmod(rank, n)] for rank in range(m * n)]


REFERENCES = {"sum": sum_ref, "topk": topk_ref, "shard_topk": shard_topk_ref}


def reference_of(name):
    """The reference a registered collective is checked against: its module's REFERENCE (a key of
    REFERENCES, or None for one checked elsewhere), else "topk" for lossy collectives and "sum"
    for dense ones. Its module is the one under tf_commlib.collectives that defines it."""
    coll = ALGORITHMS[name]
    modules = [m for key, m in sys.modules.items() if key.startswith("tf_commlib.collectives.")
               and getattr(m, "COLLECTIVE", None) is coll]
    declared = getattr(modules[0], "REFERENCE", "default") if modules else "default"
    if declared == "default":
        return "topk" if coll.lossy else "sum"
    assert declared is None or declared in REFERENCES, f"{name}: unknown REFERENCE {declared!r}"
    return declared


@pytest.fixture(scope="module", params=["2x2", "1x4", "3x1"])
def run(request, tmp_path_factory, shared):
    """(layout, per-rank reports) of one collectives_worker.py run per layout (every registered
    collective in the one job; on 1x4 and 3x1 in the shared job of the layout, tests/hvdrun.py SHARED)."""
    if "collectives" in hvdrun.SHARED.get(request.param, {}):
        return request.param, shared(request.param, "collectives")
    m, n = map(int, request.param.split("x"))
    return request.param, hvdrun.run("collectives_worker.py", m * n, tmp_path_factory.mktemp(request.param),
                                     topology=request.param)


def test_every_registered_collective_is_reference_checked_or_says_where():
    checked = {name: reference_of(name) for name in ALGORITHMS}
    assert {"dense": "sum", "2dtar": "sum", "naive_ag": "topk", "hitopk": "shard_topk",
            **{name: "topk" for name in SPARCML}}.items() <= checked.items()
    for name in ("star", "var", "star_hier", "var_hier", "powersgd"):   # tests/test_artopk.py, test_powersgd.py
        assert checked.get(name, None) is None


def test_collectives_match_numpy_on_every_rank(run):
    """Every registered collective (ALGORITHMS) against its reference (reference_of), bit for bit
    on every rank, results and residuals."""
    layout, reports = run
    m, n = map(int, layout.split("x"))
    inputs = [[np.array(r["inputs"][step], np.float32) for r in reports] for step in range(STEPS)]
    dense = [np.sum(xs, axis=0) for xs in inputs]
    checked = []
    for density in (0.05, 1.0):
        refs = {kind: fn(inputs, density, m, n) for kind, fn in REFERENCES.items()}
        nag, nag_res = refs["topk"]
        hit, hit_res = hitopk_ref(inputs, density, m, n)
        for name in ALGORITHMS:
            kind = reference_of(name)
            if kind is None:
                continue
            want, want_res = refs[kind]
            checked.append(name)
            for r in reports:  # bit-identical on every rank
                key = f"{name}@{density}"
                got = np.array(r[key]["results"], np.float32)
                np.testing.assert_array_equal(got, np.array(want), err_msg=f"{key} rank {r['rank']}")
                if want_res is not None:
                    np.testing.assert_array_equal(r[key]["residual"], want_res[r["rank"]], err_msg=key)
        if density == 1.0:  # everything is sent: sparse equals dense, nothing is left behind
            np.testing.assert_array_equal(np.array(nag), np.array(dense))
            np.testing.assert_array_equal(np.array(hit), np.array(dense))
        # error feedback conserves mass: what was aggregated + what is left = what went in
        total_in = np.sum([np.sum(xs, axis=0) for xs in inputs], axis=0)
        np.testing.assert_array_equal(np.sum(nag, axis=0) + np.sum(list(nag_res), axis=0), total_in)
        s = math.ceil(D / n)
        left = np.zeros(n * s, np.float32)
        for (i, j), rv in hit_res.items():
            left[j * s:(j + 1) * s] += rv
        np.testing.assert_array_equal(np.sum(hit, axis=0) + left[:D], total_in)
        for r in reports:
            assert len(r[f"hitopk@{density}"]["residual"]) == s
    assert {"dense", "naive_ag", "hitopk"} <= set(checked)
    for r in reports:
        np.testing.assert_array_equal(r["hitopk_graph"], hitopk_ref(inputs[:1], 0.05, m, n)[0][0])
        for density in (0.05, 1.0):   # sparse and dense step 4, chosen inside the graph
            np.testing.assert_array_equal(r[f"hitopk_var@{density}"], hitopk_ref(inputs[:1], density, m, n)[0][0])
        for step4, density in (("sparse", 1.0), ("dense", 0.05)):   # or forced by the option
            np.testing.assert_array_equal(r[f"hitopk_{step4}@{density}"], hitopk_ref(inputs[:1], density, m, n)[0][0])


def test_sparcml_sums_in_one_order_on_every_rank(run):
    check_sparcml_extras(run[1], run[0])


def check_sparcml_extras(reports, layout):
    """tests/workers/_sparcml.py's extras: on float inputs (where the order of additions matters)
    every rank gets the same bits, those of the numpy reference of SparCML's order; dsar_split_ag
    forced dense (delta=1) is still exact; with QSGD it is the same on every rank, on the QSGD
    grid, unbiased over seeds, in tf.function too."""
    k = math.ceil(0.05 * D)
    streams = []
    for r in reports:
        x = np.array(r["floats"], np.float32)
        idx = ref.mstopk(x, k, seed=seed(0, r["rank"]))[0]
        streams.append((idx, x[idx]))
    for name in SPARCML:
        want = ref.sparcml_sum(streams, D, "rd" if name == "ssar_rd" else "split")
        for r, (idx, _) in zip(reports, streams):
            np.testing.assert_array_equal(r[f"{name}:float"]["sent"], idx)
            np.testing.assert_array_equal(np.array(r[f"{name}:float"]["result"], np.float32), want,
                                          err_msg=f"{name} rank {r['rank']} on {layout}")
    inputs = [[np.array(r["inputs"][0], np.float32) for r in reports]]
    exact = naive_ag_ref(inputs, 0.05)[0][0]
    for r in reports:
        np.testing.assert_array_equal(r["dsar_split_ag:delta=1"][0], exact)
    runs = np.array(reports[0]["dsar_split_ag:qsgd_bits=4,delta=1"], np.float32)
    for r in reports:   # the same bits on every rank, for every seed
        np.testing.assert_array_equal(r["dsar_split_ag:qsgd_bits=4,delta=1"], runs)
        # in tf.function: the same bits on every rank, the eager run's rounding (the norm may
        # differ in its last bit between graph and eager)
        np.testing.assert_array_equal(r["dsar_split_ag:qsgd:graph"], reports[0]["dsar_split_ag:qsgd:graph"])
        np.testing.assert_allclose(r["dsar_split_ag:qsgd:graph"], runs[23], rtol=1e-6)
    assert len({row.tobytes() for row in runs}) == len(runs)   # the seed changes the rounding
    q = 1 << (len(reports).bit_length() - 1)
    n_slice = -(-D // q)
    scale = np.zeros(D)   # per entry: the norm of its bucket / s (s = 7 for 4 bits)
    for j in range(q):
        part = slice(j * n_slice, (j + 1) * n_slice)
        scale[part] = np.linalg.norm(exact[part].astype(np.float64)) / 7
    levels = runs / np.where(scale > 0, scale, 1)
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)
    scaled = np.abs(exact) / np.where(scale > 0, scale, 1)
    assert np.all(np.abs(levels) >= np.floor(scaled) - 1e-3) and np.all(np.abs(levels) <= np.ceil(scaled) + 1e-3)
    # unbiased: the mean over 24 seeds within 5 standard errors (each entry's std <= scale / 2)
    assert np.all(np.abs(runs.mean(axis=0) - exact) <= 5 * scale / 2 / np.sqrt(len(runs)) + 1e-6)


def check_sparcml_steps(reports, m, n):
    """tests/workers/_sparcml.py's steps: SparCML's results and residuals equal naive_ag's (the same
    selections, exact sums), on every rank, and the bytes moved their formula on the actual selections."""
    inputs = [[np.array(r["inputs"][step], np.float32) for r in reports] for step in range(STEPS)]
    for density in (0.05, 1.0):
        selections = []
        want, want_res = naive_ag_ref(inputs, density, selections)
        for name in SPARCML:
            key = f"{name}@{density}"
            for r in reports:
                np.testing.assert_array_equal(r[key]["results"], np.array(want), err_msg=key)
                np.testing.assert_array_equal(r[key]["residual"], want_res[r["rank"]], err_msg=key)
            for step in range(STEPS):
                got = {link: sum(r["bytes"][key][step][link] for r in reports) for link in link_bytes.LINKS}
                formula = ALGORITHMS[name].sent_bytes_for(selections[step], D, m, n, density)
                assert got == pytest.approx({link: m * n * v for link, v in formula.items()}, rel=1e-12), key


def expected_bytes(key, m, n, selections=None):
    """{"intra": B, "inter": B} all ranks together send in the call named `key` of the worker;
    selections: the indices each rank selected, for collectives whose bytes depend on them."""
    p = m * n
    world = {"world_reducescatter": ("reducescatter", 6 * p * 4), "world_alltoall": ("alltoall", 3 * 2 * 4),
             "world_broadcast": ("broadcast", 6 * p * 4)}
    if key in world:
        per_rank = link_bytes.per_rank(*world[key], "world", m, n)
    else:
        name, rest = key.split("@")
        density, _, option = rest.partition(":")
        options = None
        if "=" in option:
            options = {k: int(v) if v.isdigit() else v for k, v in (kv.split("=") for kv in option.split(","))}
        if selections is None:
            per_rank = ALGORITHMS[name].sent_bytes(D, m, n, float(density), options)
        else:
            per_rank = ALGORITHMS[name].sent_bytes_for(selections, D, m, n, float(density), options)
    return {link: p * per_rank[link] for link in link_bytes.LINKS}


def test_bytes_moved_equal_the_collectives_formulas(run):
    """For every registered collective (eagerly and in tf.function, both of hitopk's step-4
    branches), the bytes its primitives sent, summed over the ranks, equal its formula's; for
    SparCML's, whose bytes depend on the fill-in, its formula on the indices the ranks selected
    (numpy reference: naive_ag's selection, which SparCML's share)."""
    layout, reports = run
    m, n = map(int, layout.split("x"))
    keys = reports[0]["bytes"]
    for name in ALGORITHMS:   # nothing registered is left out
        assert {f"{name}@0.05", f"{name}@1.0", f"{name}@0.05:graph", f"{name}@1.0:graph"} <= set(keys)
    inputs = [[np.array(r["inputs"][step], np.float32) for r in reports] for step in range(STEPS)]
    selections = {}   # density -> [step][rank] indices (every graph call and option run is step 0)
    for density in (0.05, 1.0):
        naive_ag_ref(inputs, density, selections.setdefault(density, []))
    data_dependent = 0
    for key in keys:
        density = float(key.split("@")[1].split(":")[0]) if "@" in key else None
        for call in range(len(keys[key])):
            want = expected_bytes(key, m, n, selections[density][call] if density else None)
            data_dependent += bool(density and ALGORITHMS[key.split("@")[0]].actual_bytes)
            got = {link: sum(r["bytes"][key][call][link] for r in reports) for link in link_bytes.LINKS}
            assert got == pytest.approx(want, rel=1e-12, abs=1e-9), f"{key} call {call} on {layout}"
    assert data_dependent >= 3 * 2 * (STEPS + 1)   # SparCML's, from the ranks' actual selections
    if m > 1 and n > 1:   # a layout where both links carry bytes and hitopk's step 4 matters
        assert all(expected_bytes(f"{a}@0.05", m, n)["inter"] > 0 for a in ALGORITHMS)
        sparse4, dense4 = expected_bytes("hitopk@0.05", m, n), expected_bytes("hitopk@0.05:step4=dense", m, n)
        assert sparse4["intra"] < dense4["intra"] and sparse4["inter"] == dense4["inter"]


def test_collectives_are_not_constant_folded_on_some_ranks(run):
    """A rank whose input Grappler can fold must still take part in every call (it once sent the
    first call's length again: "Mismatched BROADCAST tensor shapes"); tests/workers/_folding.py,
    at the end of each layout's collectives_worker run."""
    layout, reports = run
    others = len(reports) - 1   # ranks other than the root (0), which contribute 1.0
    for r in reports:
        calls = r["folding"]
        assert [c["length"] for c in calls] == [5, 9, 2], layout
        for c in calls:
            n = c["length"]
            assert c["sent"] == list(range(n)), (layout, r["rank"])
            assert c["gathered"] == [float(n)] + [1.0] * others, (layout, r["rank"])
            assert c["summed"] == n + float(others), (layout, r["rank"])
