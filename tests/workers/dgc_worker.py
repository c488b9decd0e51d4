"""DistributedOptimizer.apply on synthetic gradients, for comparison with numpy DGC (eqs. 4, 6)."""
import keras
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tf_commlib.keras import DGC, DistributedOptimizer, Selection

topo = tf_commlib.init()
SHAPES, STEPS, LR = [(10, 8), (300,)], 5, 0.1
CASES = {
    "plain_momentum": dict(density=1.0, dgc=DGC(momentum_correction=False, momentum_masking=False)),
    "corrected_dense": dict(density=1.0, dgc=DGC(momentum_correction=True, momentum_masking=False)),
    "dgc": dict(density=0.2, dgc=DGC(momentum_correction=True, momentum_masking=True)),
    "dgc_nesterov": dict(density=0.2, dgc=DGC(momentum_correction=True, momentum_masking=True, nesterov=True)),
    "dgc_no_mask": dict(density=0.2, dgc=DGC(momentum_correction=True, momentum_masking=False)),
    "ef_only": dict(density=0.2, dgc=DGC(momentum_correction=False, momentum_masking=False)),
}


def grads(step):
    rng = np.random.default_rng(1000 * step + topo.rank)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


out = {}
for name, kw in CASES.items():
    ws = [keras.Variable(np.ones(s, np.float32), name=f"w{i}") for i, s in enumerate(SHAPES)]
    opt = DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9), algorithm="naive_ag", **kw,
                               selection=Selection(selector="exact_topk", dense_layers=lambda v: False))
    for step in range(STEPS):  # a custom GradientTape loop: d(sum(w * g))/dw = g
        gs = [tf.constant(g) for g in grads(step)]
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(w * g) for w, g in zip(ws, gs)])
        opt.apply_gradients(zip(tape.gradient(loss, ws), ws))
    out[name] = {"weights": np.concatenate([w.numpy().ravel() for w in ws]).tolist(),
                 "inner_momentum": float(opt.inner_optimizer.momentum)}
out["grads"] = [np.concatenate([g.ravel() for g in grads(s)]).tolist() for s in range(STEPS)]
report(topo.rank, out)

# qRGC: every sparse variable but the output layer (the last) is quantized to one value per sign.
ws = [keras.Variable(np.ones(s, np.float32), name=f"q{i}") for i, s in enumerate(SHAPES)]
opt = DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9), algorithm="naive_ag",
                           density=0.2, selection=Selection(qrgc=True, dense_layers=lambda v: False))
opt.apply(grads(0), ws)
out["qrgc_first_changes"] = sorted(set(np.round(1 - ws[0].numpy().ravel(), 6).tolist()))
out["qrgc_last_changes"] = len(set(np.round(1 - ws[1].numpy().ravel(), 6).tolist()))
report(topo.rank, out)
