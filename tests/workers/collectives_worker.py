"""Runs every collective for a few steps with error feedback on integer-valued inputs (so that
every sum is exact) and reports inputs, results and residuals for the numpy reference, and the
bytes this rank's primitives sent on each link (tf_commlib.link_bytes) in each call."""
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import tf_commlib  # noqa: E402
from _report import report  # noqa: E402
from tf_commlib import link_bytes, ops  # noqa: E402
from tf_commlib import primitives as P  # noqa: E402
from tf_commlib.collectives import ALGORITHMS  # noqa: E402

D, STEPS = 1001, 3
topo = tf_commlib.init()
rng = np.random.default_rng(1000 + topo.rank)
inputs = [rng.integers(-50, 51, D).astype(np.float32) for _ in range(STEPS)]


def seed(step):
    return 100 * step + topo.rank


def counted(fn):
    """fn()'s result (numpy) and the bytes this rank's primitives sent during it."""
    with link_bytes.counting() as counter:
        result = tf.nest.map_structure(lambda t: t.numpy(), fn())
        return result, counter.result()


def select_at(step):
    return lambda v, k: ops.mstopk(v, k, seed=seed(step))


out = {"inputs": [x.tolist() for x in inputs], "rank": topo.rank, "bytes": {}}
for name, coll in ALGORITHMS.items():
    for density in (0.05, 1.0):
        results, residual, sent = [], None, []
        if coll.sparse:
            residual = tf.zeros([coll.residual_size(D, topo)], tf.float32)
        for step, x in enumerate(inputs):
            if coll.sparse:
                (agg, residual, _), b = counted(lambda: coll.fn(tf.constant(x), topo, density,
                                                                select_at(step), residual))
            else:
                agg, b = counted(lambda: coll.fn(tf.constant(x), topo))
            results.append(agg.tolist())
            sent.append(b)
        out[f"{name}@{density}"] = {"results": results,
                                    "residual": None if residual is None else residual.tolist()}
        out["bytes"][f"{name}@{density}"] = sent

# every collective inside tf.function, the density in a variable (as the aggregator does): the
# bytes are counted at run time (hitopk's step 4 picks its branch then)
density = tf.Variable(0.05, dtype=tf.float64)
for name, coll in ALGORITHMS.items():
    with link_bytes.counting() as counter:
        if coll.sparse:
            f = tf.function(lambda x, r: coll.fn(x, topo, density, select_at(0), r))
        else:
            f = tf.function(lambda x, r: coll.fn(x, topo))
        r0 = tf.zeros([coll.residual_size(D, topo) if coll.sparse else 1], tf.float32)
        for value in (0.05, 1.0):
            density.assign(value)
            counter.reset()
            agg = f(tf.constant(inputs[0]), r0)
            out["bytes"][f"{name}@{value}:graph"] = [counter.result()]
            if name == "hitopk":   # sparse and dense step 4, chosen inside the graph
                out[f"hitopk_var@{value}"] = agg[0].numpy().tolist()

# the same hitopk step inside tf.function, with a Python density
coll = ALGORITHMS["hitopk"]
f = tf.function(lambda x, r: coll.fn(x, topo, 0.05, select_at(0), r))
agg, _, _ = f(tf.constant(inputs[0]), tf.zeros([coll.residual_size(D, topo)], tf.float32))
out["hitopk_graph"] = agg.numpy().tolist()

# hitopk's step 4 forced by its option, against the density's own choice
for step4, value in (("sparse", 1.0), ("dense", 0.05)):
    ctx = coll.context(options={"step4": step4})
    (agg, _, _), b = counted(lambda: coll.fn(tf.constant(inputs[0]), topo, value, select_at(0), None, ctx))
    out[f"hitopk_{step4}@{value}"] = agg.tolist()
    out["bytes"][f"hitopk@{value}:step4={step4}"] = [b]

# SparCML: float inputs (the summation order matters), dsar_split_ag forced dense (delta=1) and
# with QSGD over seeds (unbiased, the same bits on every rank), eagerly and once in tf.function
floats = np.random.default_rng(2000 + topo.rank).standard_normal(D).astype(np.float32)
for name in ("ssar_rd", "ssar_split_ag", "dsar_split_ag"):
    agg, _, sent = ALGORITHMS[name].fn(tf.constant(floats), topo, 0.05, select_at(0))
    out[f"{name}:float"] = {"result": agg.numpy().tolist(), "sent": sent.numpy().tolist()}
out["floats"] = floats.tolist()
coll = ALGORITHMS["dsar_split_ag"]
for option in ("delta=1", "qsgd_bits=4,delta=1"):
    options = {k: int(v) for k, v in (kv.split("=") for kv in option.split(","))}
    runs = []
    for s in range(24 if "qsgd" in option else 1):
        (agg, _, _), b = counted(lambda: coll.fn(tf.constant(inputs[0]), topo, 0.05, select_at(0), None,
                                                 coll.context(seed=s, options=options)))
        runs.append(agg.tolist())
    out[f"dsar_split_ag:{option}"] = runs
    out["bytes"][f"dsar_split_ag@0.05:{option}"] = [b]
f = tf.function(lambda x: coll.fn(x, topo, 0.05, select_at(0), None,
                                  coll.context(seed=tf.constant(23, tf.int64), options={"qsgd_bits": 4, "delta": 1})))
out["dsar_split_ag:qsgd:graph"] = f(tf.constant(inputs[0]))[0].numpy().tolist()

# primitives no collective runs on the world set yet: ring reduce-scatter, alltoall, broadcast
rows = tf.reshape(tf.range(6 * topo.size, dtype=tf.float32), [3 * topo.size, 2])
out["bytes"]["world_reducescatter"] = [counted(lambda: P.reducescatter(rows, topo.world))[1]]
out["bytes"]["world_alltoall"] = [counted(lambda: P.alltoall(rows, [3] * topo.size, topo.world))[1]]
out["bytes"]["world_broadcast"] = [counted(lambda: P.broadcast(rows, topo.size - 1, topo.world))[1]]
report(topo.rank, out)
