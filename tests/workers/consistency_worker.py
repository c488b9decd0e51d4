"""Ranks out of step or configured differently: each case must raise a clear ValueError on every
rank (never hang, never pair collectives of different steps). Reports each case's message."""
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tf_commlib.aggregator import ExecutionSettings, GradientAggregator

topo = tf_commlib.init()
rng = np.random.default_rng(topo.rank)


def grads(dtype=np.float32):
    return [tf.constant(rng.standard_normal(300).astype(dtype)), tf.constant(rng.standard_normal((4, 5)).astype(np.float32))]


def run(case, fn):
    print(f"rank {topo.rank}: case {case}", flush=True)
    try:
        fn()
        out[case] = None
    except (ValueError, tf.errors.OpError) as e:
        out[case] = f"{type(e).__name__}: {e}"


def skip(mode):
    agg = GradientAggregator(algorithm="hitopk", density=0.1, seed=1)
    call = tf.function(lambda g, s: agg.aggregate(g, step=s)[0]) if mode == "graph" else \
        (lambda g, s: agg.aggregate(g, step=s)[0])
    for step in range(5):
        if topo.rank == 1 and step == 2:
            continue   # this rank skips step 2 of its loop
        call(grads(), tf.constant(step, tf.int64))
    out[f"steps_done_{mode}"] = step


out = {}
run("skip_eager", lambda: skip("eager"))
run("skip_graph", lambda: skip("graph"))
run("density", lambda: GradientAggregator("hitopk", density=0.02 if topo.rank == 1 else 0.01)(grads()))
run("algorithm", lambda: GradientAggregator("naive_ag" if topo.rank == 3 else "hitopk", density=0.01)(grads()))
run("dtype_unchecked", lambda: GradientAggregator("naive_ag", density=0.1, execution=ExecutionSettings(check_consistency=False))(
    grads(np.float64 if topo.rank == 2 else np.float32)))
unchecked = GradientAggregator("hitopk", density=0.1, execution=ExecutionSettings(check_consistency=False))
step = tf.function(lambda g: unchecked(g))
run("dtype_unchecked_graph", lambda: step(grads(np.float64 if topo.rank == 2 else np.float32)))
# a consistent run still works after the failures, and equals the dense sum
g = grads()
agg = GradientAggregator("2dtar", op="sum")(g)
every = tf_commlib.primitives.allgather(tf.stack([g[0]]), topo.world).numpy().sum(0)
out["after_ok"] = bool(np.allclose(agg[0].numpy(), every, rtol=1e-5, atol=1e-5))
report(topo.rank, out)
