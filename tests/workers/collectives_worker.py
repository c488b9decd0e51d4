"""Runs every collective for a few steps with error feedback on integer-valued inputs (so that
every sum is exact) and reports inputs, results and residuals for the numpy reference, and the
bytes this rank's primitives sent on each link (tf_commlib.link_bytes) in each call; then
tests/workers/_folding.py's calls on constants Grappler could fold."""
import tensorflow as tf

import tf_commlib
from tests.workers import _folding, _sparcml
from tests.workers._report import report
from tests.workers._sparcml import D, counted
from tf_commlib import link_bytes
from tf_commlib import primitives
from tf_commlib.collectives import ALGORITHMS

topo = tf_commlib.init()
inputs = _sparcml.inputs_of(topo.rank)


def select_at(step):
    return _sparcml.select_at(step, topo.rank)


out = {"inputs": [x.tolist() for x in inputs], "rank": topo.rank, "bytes": {}}
for name, coll in ALGORITHMS.items():
    for density in (0.05, 1.0):
        results, residual, sent = [], None, []
        if coll.lossy:
            residual = tf.zeros([coll.state_size(D, topo)], tf.float32)
        for step, x in enumerate(inputs):
            if coll.lossy:
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
        if coll.lossy:
            f = tf.function(lambda x, r: coll.fn(x, topo, density, select_at(0), r))
        else:
            f = tf.function(lambda x, r: coll.fn(x, topo))
        r0 = tf.zeros([coll.state_size(D, topo) if coll.lossy else 1], tf.float32)
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
agg, _, _ = f(tf.constant(inputs[0]), tf.zeros([coll.state_size(D, topo)], tf.float32))
out["hitopk_graph"] = agg.numpy().tolist()

# hitopk's step 4 forced by its option, against the density's own choice
for step4, value in (("sparse", 1.0), ("dense", 0.05)):
    ctx = coll.context(options={"step4": step4})
    (agg, _, _), b = counted(lambda: coll.fn(tf.constant(inputs[0]), topo, value, select_at(0), None, ctx))
    out[f"hitopk_{step4}@{value}"] = agg.tolist()
    out["bytes"][f"hitopk@{value}:step4={step4}"] = [b]

# SparCML: float inputs, dsar_split_ag forced dense and with QSGD (tests/workers/_sparcml.py)
_sparcml.extras(topo, out)

# primitives no collective runs on the world set yet: ring reduce-scatter, alltoall, broadcast
rows = tf.reshape(tf.range(6 * topo.size, dtype=tf.float32), [3 * topo.size, 2])
out["bytes"]["world_reducescatter"] = [counted(lambda: primitives.reducescatter(rows, topo.world))[1]]
out["bytes"]["world_alltoall"] = [counted(lambda: primitives.alltoall(rows, [3] * topo.size, topo.world))[1]]
out["bytes"]["world_broadcast"] = [counted(lambda: primitives.broadcast(rows, topo.size - 1, topo.world))[1]]

# last (it turns op determinism on for the rest of the process): constant folding on some ranks
out["folding"] = _folding.run(topo)
report(topo.rank, out)
