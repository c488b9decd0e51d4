"""What reaches a collective through GradientAggregator and DistributedOptimizer: a collective
registered here records its Context (step, seed, options, bucket) eagerly and in tf.function;
and the aggregator's byte formula against the bytes its primitives moved."""
import dataclasses

import keras
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tf_commlib import link_bytes
from tf_commlib import primitives
from tf_commlib.aggregator import ExecutionSettings, GradientAggregator
from tf_commlib.collectives import ALGORITHMS, Collective, dense, hitopk, register
from tf_commlib.keras import Selection, DistributedOptimizer

topo = tf_commlib.init()
SHAPES, STEPS = [(40,), (6, 5)], 3   # two buckets with fusion_threshold_bytes=160
seen_step = tf.Variable([-1, -1], dtype=tf.int64)
seen_seed = tf.Variable([-1, -1], dtype=tf.int64)
seen_options = []


def probe(x, topo, ctx=None):
    """Dense allreduce that records what the aggregator passed."""
    seen_step[ctx.bucket].assign(ctx.step)
    seen_seed[ctx.bucket].assign(-2 if ctx.seed is None else ctx.seed)
    seen_options.append(dict(ctx.options))   # at trace time inside tf.function
    return primitives.allreduce(x, topo.world)


register(Collective("probe", probe, dense.time, dense.sent_bytes, options={"tag": "none"}))
register(dataclasses.replace(hitopk.COLLECTIVE, name="hitopk_half", density_scale=0.5))   # at half the density


def grads(step):
    rng = np.random.default_rng(100 * step + topo.rank)
    return [tf.constant(rng.integers(-9, 10, s).astype(np.float32)) for s in SHAPES]


out = {"rank": topo.rank}
for mode in ("eager", "graph"):
    agg = GradientAggregator("probe", op="sum", fusion_threshold_bytes=160, seed=5,
                             algorithm_options={"probe": {"tag": mode}})
    call = tf.function(agg) if mode == "graph" else agg
    rows = []
    for step in range(STEPS):
        result = call(grads(step))
        rows.append({"steps": seen_step.numpy().tolist(), "seeds": seen_seed.numpy().tolist(),
                     "results": [r.numpy().ravel().tolist() for r in result],
                     "inputs": [g.numpy().ravel().tolist() for g in grads(step)]})
    out[mode] = {"rows": rows, "options": seen_options[-1], "buckets": len(agg.buckets)}

# DistributedOptimizer passes algorithm_options to its aggregators
ws = [keras.Variable(np.ones(s, np.float32), name=f"w{i}") for i, s in enumerate(SHAPES)]
opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), algorithm="probe",
                           algorithm_options={"probe": {"tag": "opt"}},
                           selection=Selection(dense_layers=lambda v: False))
opt.apply(grads(0), ws)
out["optimizer_options"] = seen_options[-1]
out["optimizer_sent"] = opt.sent_bytes_at(0)

# GradientAggregator.sent_bytes (what train prints) against the bytes moved, two buckets; hitopk_half
# at 0.2 runs as hitopk at 0.1
out["sent"] = {}
for name, (algorithm, kw) in {
        "hitopk": ("hitopk", dict(density=0.05)), "hitopk_0.1": ("hitopk", dict(density=0.1, seed=5)),
        "hitopk_half": ("hitopk_half", dict(density=0.2, seed=5)),
        "hitopk_dense4": ("hitopk", dict(density=0.05, algorithm_options={"hitopk": {"step4": "dense"}})),
        "naive_ag": ("naive_ag", dict(density=0.2)), "2dtar": ("2dtar", {})}.items():
    agg = GradientAggregator(algorithm, fusion_threshold_bytes=160,
                             execution=ExecutionSettings(check_consistency=False), **kw)
    with link_bytes.counting() as counter:
        result = agg(grads(0))
        out["sent"][name] = {"counted": counter.result(), "formula": agg.sent_bytes(),
                             "result": [r.numpy().ravel().tolist() for r in result]}
# SparCML's collectives through the aggregator in tf.function at density 1.0 (= the dense sum), and
# dsar_split_ag's QSGD option reaching it (the same bits on every rank)
out["sparcml"] = {}
for name, options in {"ssar_rd": None, "ssar_split_ag": None, "dsar_split_ag": None,
                      "dsar_qsgd": {"dsar_split_ag": {"qsgd_bits": 2}}}.items():
    agg = GradientAggregator(name.replace("dsar_qsgd", "dsar_split_ag"), density=1.0, op="sum",
                             fusion_threshold_bytes=160, seed=5, algorithm_options=options)
    call = tf.function(agg)
    out["sparcml"][name] = [[r.numpy().ravel().tolist() for r in call(grads(step))] for step in range(2)]
for name in ("probe", "hitopk_half"):   # the later cases of the shared job choose among the registered ones
    ALGORITHMS.pop(name)
report(topo.rank, out)
