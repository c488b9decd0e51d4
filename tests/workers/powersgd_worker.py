"""PowerSGD and 16-bit dense values on the wire (issue 29 §2-3): powersgd for 3 steps with its state
(eagerly, and through GradientAggregator in tf.function), dense and 2dtar with compression, and the
bytes each sent; checked against numpy by tests/test_powersgd.py."""
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tests.workers._sparcml import counted
from tf_commlib import link_bytes
from tf_commlib.aggregator import GradientAggregator
from tf_commlib.collectives import ALGORITHMS, powersgd

topo = tf_commlib.init()
D, STEPS, RANK = 1500, 3, 3   # a 39 x 39 matrix (21 entries of padding)
rng = np.random.default_rng(50 + topo.rank)
inputs = [rng.standard_normal(D).astype(np.float32) for _ in range(STEPS)]
out = {"rank": topo.rank, "inputs": [x.tolist() for x in inputs], "bytes": {}}

coll = ALGORITHMS["powersgd"]
ctx = coll.context(options={"rank": RANK}, bucket=3)
rows, cols = powersgd.shape(D)
out["q0"] = {b: powersgd.initial_q(cols, RANK, b).numpy().tolist() for b in (0, 3)}
state, steps = None, []
for x in inputs:
    (result, state, sent), b = counted(lambda: coll.fn(tf.constant(x), topo, 0.01, None, state, ctx))
    steps.append({"result": result.tolist(), "residual": state[:D].tolist(), "q": state[D:].tolist(),
                  "sent": len(sent), "bytes": b})
out["powersgd"] = steps
small = ALGORITHMS["powersgd"].context(options={"min_compression_size": 2 * D})   # summed exactly
(result, state, _), b = counted(lambda: coll.fn(tf.constant(inputs[0]), topo, 0.01, None, None, small))
out["powersgd_dense"] = {"result": result.tolist(), "state": state.tolist(), "bytes": b}

# through the aggregator in tf.function: two tensors in one bucket, state in its variable
agg = GradientAggregator("powersgd", op="sum", algorithm_options={"powersgd": {"rank": RANK}})
call = tf.function(lambda gs: agg.aggregate(gs, sent="indices")[0])
graph = []
with link_bytes.counting() as counter:
    for x in inputs:
        counter.reset()
        got = call([tf.reshape(tf.constant(x[:1000]), [40, 25]), tf.constant(x[1000:])])
        graph.append({"result": np.concatenate([g.numpy().ravel() for g in got]).tolist(),
                      "bytes": counter.result()})
out["graph"] = graph
out["graph_formula"] = agg.sent_bytes()
out["graph_state"] = agg.residual_variables()[0].numpy().tolist()

# 16-bit values on the wire: dense and 2dtar; entry 0 beyond fp16's range on every rank, entry 1 on
# rank 0 only (mean 17500: in range after the 1/size), entry 2 tiny
x = inputs[0] * 10.0 ** rng.integers(-3, 4, D)
x[:3] = [1e5, 7e4 if topo.rank == 0 else 0.0, 1e-6]
out["wide"] = x.tolist()
for name in ("dense", "2dtar"):
    for compression in ("none", "fp16", "bf16"):
        c = ALGORITHMS[name].context(options={"compression": compression})
        result, b = counted(lambda: ALGORITHMS[name].fn(tf.constant(x, tf.float32), topo, c))
        out[f"{name}:{compression}"] = {"result": result.tolist(), "bytes": b}
        f = tf.function(lambda v: ALGORITHMS[name].fn(v, topo, c))
        out[f"{name}:{compression}:graph"] = f(tf.constant(x, tf.float32)).numpy().tolist()
report(topo.rank, out)
