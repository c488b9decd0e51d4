"""Every collective that takes value_codec, with each codec, for a few steps with error feedback on
float inputs: reports inputs, what each step selected (before the codec), results, residuals and
the bytes this rank's primitives sent; then qRGC's constant values, and the codec reaching hitopk
through GradientAggregator and DistributedOptimizer inside tf.function (tests/test_value_codec.py)."""
import time

import keras
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tf_commlib import link_bytes, ops
from tf_commlib.aggregator import ExecutionSettings, GradientAggregator
from tf_commlib.collectives import ALGORITHMS
from tf_commlib.keras import Selection, DistributedOptimizer

D, STEPS, DENSITY = 1000, 2, 0.05
VARIANTS = {"naive_ag": ("naive_ag", {}), "hitopk": ("hitopk", {}),
            "hitopk_dense4": ("hitopk", {"step4": "dense"}), "ssar_rd": ("ssar_rd", {}),
            "ssar_split_ag": ("ssar_split_ag", {}), "dsar_split_ag": ("dsar_split_ag", {})}
SPARCML = ("ssar_rd", "ssar_split_ag", "dsar_split_ag")   # no "mean": merged streams carry sums
topo = tf_commlib.init()
rng = np.random.default_rng(7 + topo.rank)
inputs = [(rng.standard_normal(D) * 10.0 ** rng.uniform(-3, 2, D)).astype(np.float32) for _ in range(STEPS)]


def recording(selector, log):
    def select(v, k):
        values, indices = selector(v, k)
        log.append([values.numpy().tolist(), indices.numpy().tolist()])
        return values, indices
    return select


def run(name, options, codec, selector):
    coll = ALGORITHMS[name]
    residual = tf.zeros([coll.state_size(D, topo)], tf.float32)
    rows = []
    for step, x in enumerate(inputs):
        ctx = coll.context(step=step, options={**options, "value_codec": codec})
        selected = []
        with link_bytes.counting() as counter:
            agg, residual, _ = coll.fn(tf.constant(x), topo, DENSITY, recording(selector(step), selected),
                                       residual, ctx)
            sent = counter.result()
        rows.append({"result": agg.numpy().tolist(), "selected": selected[0], "sent": sent})
    flush = coll.residual_to_input(residual, D, topo)
    return {"rows": rows, "residual": residual.numpy().tolist(), "flush": flush.numpy().tolist(),
            "options": dict(ctx.options)}


t0 = time.perf_counter()
out = {"rank": topo.rank, "inputs": [x.tolist() for x in inputs], "topk": {}, "qrgc": {}}
for variant, (name, options) in VARIANTS.items():
    for codec in ("none", "fp16") if name in SPARCML else ("none", "fp16", "mean"):
        out["topk"][f"{variant}:{codec}"] = run(name, options, codec, lambda step: ops.exact_topk)
        if codec != "fp16" and variant in ("naive_ag", "hitopk"):
            out["qrgc"][f"{variant}:{codec}"] = run(name, options, codec,
                                                   lambda step: lambda v, k: ops.qrgc(v, k, step))

out["t_collectives"] = time.perf_counter() - t0
# end to end: algorithm_options={"hitopk": {"value_codec": ...}} through the aggregator (two
# buckets; "mean" inside tf.function) and the optimizer
shapes = [(40,), (6, 5)]
grads = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in shapes]
out["aggregator"] = {}
for codec in ("none", "fp16", "mean"):
    agg = GradientAggregator("hitopk", density=0.2, op="sum", fusion_threshold_bytes=160, seed=3,
                             execution=ExecutionSettings(check_consistency=False),
                             algorithm_options={"hitopk": {"value_codec": codec}})
    call = tf.function(agg) if codec == "mean" else agg   # mean's decode loop in a graph; the others eagerly
    with link_bytes.counting() as counter:
        result = call(grads)
        counted = counter.result()
    out[f"t_agg_{codec}"] = time.perf_counter() - t0
    out["aggregator"][codec] = {"result": [r.numpy().ravel().tolist() for r in result],
                                "counted": counted, "formula": agg.sent_bytes()}
ws = [keras.Variable(np.ones(s, np.float32)) for s in shapes]
opt = DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm="hitopk", density=0.2,
                           algorithm_options={"hitopk": {"value_codec": "fp16"}},
                           selection=Selection(dense_layers=lambda v: False, seed=3))
for _ in range(2):
    opt.apply(grads, ws)
out["weights"] = [w.numpy().ravel().tolist() for w in ws]
out["t_aggregator"] = time.perf_counter() - t0
# DistributedOptimizer(selection=Selection(qrgc=True)): the qRGC group (all but the last variable) defaults to "mean"
out["qrgc_optimizer"] = {"weights": {}, "sent": {}}
for codec in ("mean", "none"):
    ws = [keras.Variable(np.ones(s, np.float32)) for s in shapes]
    options = None if codec == "mean" else {"hitopk": {"value_codec": "none"}}
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm="hitopk", density=0.2,
                               algorithm_options=options,
                               selection=Selection(qrgc=True, dense_layers=lambda v: False, seed=3))
    for _ in range(2):
        opt.apply(grads, ws)
    out["qrgc_optimizer"]["weights"][codec] = [w.numpy().ravel().tolist() for w in ws]
    out["qrgc_optimizer"]["sent"][codec] = opt.sent_bytes_at(0)
    if codec == "mean":
        out["qrgc_optimizer"]["options"] = opt._groups[0].aggregator.algorithm_options
out["t_total"] = time.perf_counter() - t0
report(topo.rank, out)
