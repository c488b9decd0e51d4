"""AR-Topk (star, var, star_hier, var_hier) through GradientAggregator inside tf.function on two
buckets for a few steps (the step, hence STAR's root, reaches the collective in its Context), on integer-valued
inputs so that every sum is exact: reports inputs, results, final residuals and the bytes this
rank's primitives sent in each step; and hier variants on a tensor so short that a shard is short
and (5 ranks per node) another empty."""
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers import _sparcml
from tests.workers._report import report
from tf_commlib import link_bytes, ops
from tf_commlib.aggregator import ExecutionSettings, GradientAggregator
from tf_commlib.collectives import ALGORITHMS

SHAPES, STEPS, SEED = [(601,), (20, 20)], 3, 11   # two buckets (601 and 400 floats)
NAMES, DENSITIES = ("star", "var", "star_hier", "var_hier"), (0.05, 1.0)
topo = tf_commlib.init()
rng = np.random.default_rng(1000 + topo.rank)
inputs = [[rng.integers(-50, 51, s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]

out = {"rank": topo.rank, "m": topo.m, "n": topo.n, "inputs": [np.concatenate([g.ravel() for g in gs]).tolist()
                                                              for gs in inputs]}
for name in NAMES:
    for density in DENSITIES:
        agg = GradientAggregator(name, density=density, selector="mstopk", op="sum", seed=SEED,
                                 fusion_threshold_bytes=4 * 601,
                                 # its step-0 allgather is not the collective
                                 execution=ExecutionSettings(check_consistency=False))
        call = tf.function(agg)
        results, sent = [], []
        with link_bytes.counting() as counter:
            for step in range(STEPS):
                counter.reset()
                got = call([tf.constant(g) for g in inputs[step]])
                results.append(np.concatenate([g.numpy().ravel() for g in got]).tolist())
                sent.append(counter.result())
                if step == 0:   # the first call traces twice (it makes the variables)
                    first = call.experimental_get_tracing_count()
        out[f"{name}@{density}"] = {"results": results, "sent": sent,
                                    "traces": [first, call.experimental_get_tracing_count()],   # root moved
                                    "residuals": [v.numpy().tolist() for v in agg.residual_variables()]}

# d = 7 on n ranks per node: shards of ceil(7 / n), so with n = 2 the last one is short (4, 3) and
# with n = 5 one is short and one empty (2, 2, 2, 1, 0) (eager, step 0, the aggregator's seed for
# step 0 and bucket 0)
tiny = tf.constant(np.arange(1, 8, dtype=np.float32) * (topo.rank + 1))
for name in ("star_hier", "var_hier"):
    result, residual, _ = ALGORITHMS[name].fn(tiny, topo, 0.5, lambda x, k: ops.mstopk(x, k, seed=SEED * topo.size + topo.rank))
    out[f"{name}@tiny"] = {"results": result.numpy().tolist(), "residual": residual.numpy().tolist()}
if topo.size == 5:   # SparCML folding 5 ranks onto 4 (the other layouts run in collectives_worker)
    out["sparcml"] = {"bytes": {}, "rank": topo.rank}
    _sparcml.steps(topo, out["sparcml"])
    _sparcml.extras(topo, out["sparcml"])
report(topo.rank, out)
