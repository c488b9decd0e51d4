"""GradientAggregator on mixed shapes/dtypes/None, eagerly and in tf.function, and a rank mismatch."""
import numpy as np
import tensorflow as tf

import tf_commlib
from tf_commlib import fusion
from tests.workers._report import report
from tf_commlib.aggregator import Auto, GradientAggregator
from tf_commlib.collectives import ALGORITHMS

topo = tf_commlib.init()
rng = np.random.default_rng(7 + topo.rank)
SHAPES = [((3, 4), np.float32), None, ((7,), np.float32), ((2, 3), np.float16), ((5000,), np.float32)]


def grads():
    return [None if s is None else tf.constant(rng.integers(-8, 9, s[0]).astype(s[1])) for s in SHAPES]


# Every registered collective in buckets of at most 64 bytes (4 buckets here), at density 1: the
# exact sum of the integer-valued inputs, bucket by bucket (powersgd is a low-rank approximation:
# tests/test_powersgd.py checks it per bucket against numpy).
BUCKETED = {f"bucketed_{name}": dict(algorithm=name, density=1.0, fusion_threshold_bytes=64)
            for name in sorted(ALGORITHMS) if name != "powersgd"}
out = {"rank": topo.rank, "cases": {}}
for name, kw in {
    "dense": dict(algorithm="dense"),
    "2dtar_small_buckets": dict(algorithm="2dtar", fusion_threshold_bytes=64),
    "hitopk_full": dict(algorithm="hitopk", density=1.0, fusion_threshold_bytes=1000),
    "naive_ag_full_sum": dict(algorithm="naive_ag", density=1.0, op="sum"),
    **BUCKETED,
}.items():
    g = grads()
    res = GradientAggregator(**kw)(g)
    out["cases"][name] = {
        "inputs": [None if t is None else t.numpy().astype(np.float64).tolist() for t in g],
        "outputs": [None if t is None else t.numpy().astype(np.float64).tolist() for t in res],
        "dtypes": [None if t is None else t.dtype.name for t in res],
        "shapes": [None if t is None else list(t.shape) for t in res],
    }

# Sparse, eager vs tf.function with the same seed: same results and same residuals, 2 steps.
g1, g2 = grads(), grads()
eager = GradientAggregator(algorithm="hitopk", density=0.1, seed=3)
graph = GradientAggregator(algorithm="hitopk", density=0.1, seed=3)
step = tf.function(lambda gs: graph(gs))
same = True
for g in (g1, g2):
    a, b = eager(g), step(g)
    same &= all(x is None and y is None or np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a, b))
same &= all(np.array_equal(x.numpy(), y.numpy())
            for x, y in zip(eager.residual_variables(), graph.residual_variables()))
out["eager_equals_graph"] = bool(same)
out["state_sizes"] = [int(v.shape[0]) for v in eager.residual_variables()]

# A step traced for one candidate only (trace_active_only, as algorithm="auto" runs it): the
# residual the previous candidate left enters the first step of the new trace and is zeroed there;
# the later steps of that trace neither read nor write it (planted: a value they must leave alone).
def normal():
    return [tf.constant(rng.normal(size=s).astype(np.float32)) for s in ((30, 20), (50,))]


switch = GradientAggregator(algorithm=["hitopk", "dense"], density=0.1, seed=5, fusion_threshold_bytes=1 << 20)
switch.trace_active_only = True
switch.build([(tf.TensorShape(s), tf.float32) for s in ((30, 20), (50,))])
switch.set_algorithm("hitopk")
step = tf.function(lambda gs: switch(gs))
for _ in range(2):
    step(normal())
(residual,) = switch.residual_variables()
left = [None, None]
fusion.unflatten(ALGORITHMS["hitopk"].residual_to_input(tf.convert_to_tensor(residual), 650, topo),
                 switch.buckets[0], left)
switch.set_algorithm("dense")
step = tf.function(lambda gs: switch(gs))
g3, g4 = normal(), normal()
o3 = step(g3)
zeroed = bool(not np.any(residual.numpy()))
planted = np.linspace(-1, 1, residual.shape[0]).astype(np.float32)
residual.assign(planted)
o4 = step(g4)
out["switched"] = {"left": [t.numpy().tolist() for t in left], "g3": [t.numpy().tolist() for t in g3],
                   "o3": [t.numpy().tolist() for t in o3], "g4": [t.numpy().tolist() for t in g4],
                   "o4": [t.numpy().tolist() for t in o4], "zeroed": zeroed,
                   "planted_kept": bool(np.array_equal(residual.numpy(), planted))}

# What was sent, as masks and as indices (eagerly, and in tf.function through a switch_case over two
# candidates): the indices of each tensor are exactly where its mask is 1; none for a dense bucket.
def sent_forms(active, in_graph):
    g = grads()
    forms = []
    for sent in ("mask", "indices"):
        agg = GradientAggregator(algorithm=["hitopk", "2dtar"], density=0.1, seed=5, fusion_threshold_bytes=1000)
        agg.build([None if t is None else (t.shape, t.dtype) for t in g])
        agg.set_algorithm(active)
        call = lambda gs: agg.aggregate(gs, sent=sent)  # noqa: E731
        forms.append((tf.function(call) if in_graph else call)(g))
    return forms


agree = True
for active, in_graph in (("hitopk", False), ("hitopk", True), ("2dtar", False)):
    (_, masks), (_, where) = sent_forms(active, in_graph)
    for m, w in zip(masks, where):
        if m is None:
            agree &= w is None
            continue
        flat = m.numpy().ravel()
        agree &= w.dtype == tf.int64 and set(np.flatnonzero(flat)) == set(w.numpy().tolist())
        agree &= set(np.unique(flat)) <= {0, 1}
out["sent_forms_agree"] = bool(agree)

# A rank that passes a different shape must make every rank raise, not hang.
bad = grads()
if topo.rank == 1:
    bad[2] = tf.zeros([8], tf.float32)
try:
    GradientAggregator(algorithm="naive_ag", density=0.5)(bad)
    out["mismatch"] = None
except ValueError as e:
    out["mismatch"] = str(e)

# "auto" resolved differently per rank (rank 0 told the step's compute hides every collective, the
# others not): every rank must raise, naming the algorithms, not run different collectives.
from tf_commlib.alphabeta import LinkParams  # noqa: E402

slow = LinkParams(beta_inter=8 / 10e6)
split = GradientAggregator(algorithm="auto", density=0.01,
                           auto=Auto(cost_params=slow, compute_s=100.0 if topo.rank == 0 else 0.0))
try:
    split([tf.ones([400, 500], tf.float32)])
    out["auto_mismatch"] = None
except ValueError as e:
    out["auto_mismatch"] = str(e)
report(topo.rank, out)
