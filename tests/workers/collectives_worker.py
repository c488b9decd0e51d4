"""Runs every collective for a few steps with error feedback on integer-valued inputs (so that
every sum is exact) and reports inputs, results and residuals for the numpy reference."""
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import tf_commlib  # noqa: E402
from _report import report  # noqa: E402
from tf_commlib import ops  # noqa: E402
from tf_commlib.collectives import ALGORITHMS  # noqa: E402

D, STEPS = 1001, 3
topo = tf_commlib.init()
rng = np.random.default_rng(1000 + topo.rank)
inputs = [rng.integers(-50, 51, D).astype(np.float32) for _ in range(STEPS)]


def seed(step):
    return 100 * step + topo.rank


out = {"inputs": [x.tolist() for x in inputs], "rank": topo.rank}
for name, coll in ALGORITHMS.items():
    for density in (0.05, 1.0):
        results, residual = [], None
        if coll.sparse:
            residual = tf.zeros([coll.residual_size(D, topo)], tf.float32)
        for step, x in enumerate(inputs):
            if coll.sparse:
                select = (lambda s: lambda v, k: ops.mstopk(v, k, seed=s))(seed(step))
                agg, residual, _ = coll.fn(tf.constant(x), topo, density, select, residual)
            else:
                agg = coll.fn(tf.constant(x), topo)
            results.append(agg.numpy().tolist())
        out[f"{name}@{density}"] = {"results": results,
                                    "residual": None if residual is None else residual.numpy().tolist()}

# the same hitopk step inside tf.function
coll = ALGORITHMS["hitopk"]
f = tf.function(lambda x, r: coll.fn(x, topo, 0.05, lambda v, k: ops.mstopk(v, k, seed=seed(0)), r))
agg, _, _ = f(tf.constant(inputs[0]), tf.zeros([coll.residual_size(D, topo)], tf.float32))
out["hitopk_graph"] = agg.numpy().tolist()

# density held in a variable (as the aggregator does): step 4 branches at run time
density = tf.Variable(0.05, dtype=tf.float64)
f = tf.function(lambda x, r: coll.fn(x, topo, density, lambda v, k: ops.mstopk(v, k, seed=seed(0)), r))
for value in (0.05, 1.0):
    density.assign(value)
    agg, _, _ = f(tf.constant(inputs[0]), tf.zeros([coll.residual_size(D, topo)], tf.float32))
    out[f"hitopk_var@{value}"] = agg.numpy().tolist()
report(topo.rank, out)
