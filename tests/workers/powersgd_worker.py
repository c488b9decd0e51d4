"""PowerSGD and 16-bit dense values on the wire: powersgd on a bucket of five tensors
for 3 steps with its state (eagerly, and through GradientAggregator in tf.function), dense and 2dtar
with compression, and the bytes each sent; checked against numpy by tests/test_powersgd.py."""
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tests.workers._sparcml import counted
from tf_commlib import link_bytes
from tf_commlib.aggregator import GradientAggregator
from tf_commlib.collectives import ALGORITHMS, powersgd

topo = tf_commlib.init()
# one bucket of a conv kernel (36 x 8), a bias, a dense kernel (20 x 30), a tiny matrix (under
# min_compression_size) and a wide one (its rank-3 factors are larger than it): two compressed
SHAPES = [(3, 3, 4, 8), (30,), (20, 30), (4, 5), (2, 100)]
D, STEPS, RANK = sum(int(np.prod(s)) for s in SHAPES), 3, 3
OPTIONS = {"rank": RANK, "min_compression_size": 64}
rng = np.random.default_rng(50 + topo.rank)
inputs = [rng.standard_normal(D).astype(np.float32) for _ in range(STEPS)]
out = {"rank": topo.rank, "inputs": [x.tolist() for x in inputs], "bytes": {}}

coll = ALGORITHMS["powersgd"]
ctx = coll.context(options=OPTIONS, bucket=3, shapes=SHAPES)
tensors = powersgd.layout(D, coll.formula_options(OPTIONS, SHAPES, D))
out["layout"] = [list(t) for t in tensors]
out["q0"] = {b: {t.index: powersgd.initial_q(t.cols, RANK, b, t.index).numpy().tolist()
                 for t in tensors if t.compressed} for b in (0, 3)}
state, steps = None, []
for x in inputs:
    (result, state, sent), b = counted(lambda: coll.fn(tf.constant(x), topo, 0.01, None, state, ctx))
    steps.append({"result": result.tolist(), "residual": state[:D].tolist(), "q": state[D:].tolist(),
                  "sent": len(sent), "bytes": b})
out["powersgd"] = steps
# Q zeroed (as a reset or a flush leaves it), residual kept: Q is drawn again
zeroed = tf.concat([state[:D], tf.zeros([len(state) - D])], 0)
result, restart = coll.fn(tf.constant(inputs[0]), topo, 0.01, None, zeroed, ctx)[:2]
out["restart"] = {"result": result.numpy().tolist(), "residual": restart[:D].numpy().tolist()}
for name, c in {"small": coll.context(options={**OPTIONS, "min_compression_size": 2 * D}, shapes=SHAPES),
                "flat": coll.context(options=OPTIONS)}.items():   # summed exactly
    (result, state, _), b = counted(lambda: coll.fn(tf.constant(inputs[0]), topo, 0.01, None, None, c))
    out[f"powersgd_{name}"] = {"result": result.tolist(), "state": state.tolist(), "bytes": b}


def as_grads(x):
    return [tf.reshape(tf.constant(x[t.offset:t.offset + t.size]), shape) for t, shape in zip(tensors, SHAPES)]


# through the aggregator in tf.function: the five tensors in one bucket, state in its variable
agg = GradientAggregator("powersgd", op="sum", algorithm_options={"powersgd": OPTIONS})
call = tf.function(lambda gs: agg.aggregate(gs, sent="indices")[0])
graph = []
with link_bytes.counting() as counter:
    for x in inputs:
        counter.reset()
        got = call(as_grads(x))
        graph.append({"result": np.concatenate([g.numpy().ravel() for g in got]).tolist(),
                      "bytes": counter.result()})
out["graph"] = graph
out["graph_buckets"] = len(agg.buckets)
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
