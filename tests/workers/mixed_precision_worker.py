"""Mixed precision with DistributedOptimizer under model.fit and default_callbacks().

``collectives``: mixed_float16, Keras' compile wraps the DistributedOptimizer in its
LossScaleOptimizer; one epoch per collective (schedule), and at step OVERFLOW of every epoch rank 0
alone feeds a batch that overflows float16. Reports, per epoch, what that step changed. Then the
same for 2 epochs of the sharded update (shard_optimizer=True, 2dtar, fp16 deltas, Adam), and for
2 epochs of it sharded over a node's ranks (hitopk, then 2dtar).
``forms``: with_loss_scale(keras LossScaleOptimizer(SGD)) trains (and grows its scale) with
AdaptiveDensity profiling through the wrapper, a
custom loop with a per-rank keras LossScaleOptimizer is refused, mixed_bfloat16 trains."""
import hashlib
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tf_commlib.keras import (DGC, AdaptiveDensity, DistributedOptimizer, Selection, default_callbacks,
                              distributed_optimizer, with_loss_scale)
from tf_commlib.keras.adaptive import profile_batches

START = time.perf_counter()
topo = tf_commlib.init()
BATCH, STEPS, OVERFLOW = 8, 4, 1


def data(rank, overflow_at=None):
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(BATCH * STEPS, 32)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    if overflow_at is not None and rank == 0:
        x[overflow_at * BATCH:(overflow_at + 1) * BATCH] = 6e4   # float16 overflows (max 65504)
    return x, y


def model_with(opt, policy):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    return model


def digest(values):
    return hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in values)).hexdigest()


def class_name(obj):
    return f"{type(obj).__module__}.{type(obj).__name__}"


def rank_state(opt):
    """DGC momentum and every aggregator's residuals (numpy)."""
    residuals = [v for g in opt._groups for v in g.aggregator.residuals.values()]
    shards = list(opt._sharded.slots.values()) if opt._sharded is not None else []   # this rank's slices
    return [v.numpy() for v in list(opt.velocities) + residuals + shards]


class OverflowProbe(keras.callbacks.Callback):
    """What step OVERFLOW of each epoch changed: iterations, loss scale, weights, rank state."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_train_batch_begin(self, batch, logs=None):
        if batch == OVERFLOW:
            opt = self.model.optimizer
            self.before = (int(opt.iterations.numpy()), float(opt.dynamic_scale.numpy()),
                           [w.numpy() for w in self.model.weights], rank_state(distributed_optimizer(self.model)))

    def on_train_batch_end(self, batch, logs=None):
        if batch != OVERFLOW:
            return
        opt, dist = self.model.optimizer, distributed_optimizer(self.model)
        iterations, scale, weights, state = self.before
        after = rank_state(dist)
        self.epochs.append({
            "algorithm": dist.algorithm_at(len(self.epochs)),
            "iterations": [iterations, int(opt.iterations.numpy())],
            "scale": [scale, float(opt.dynamic_scale.numpy())],
            "weights_unchanged": all(np.array_equal(a, w.numpy()) for a, w in zip(weights, self.model.weights)),
            "state_unchanged": len(state) > 0 and all(np.array_equal(a, b) for a, b in zip(state, after)),
            "state_finite": all(np.isfinite(a).all() for a in after)})


def collectives():
    algorithms = ["dense", "2dtar", "hitopk", "ssar_rd", "ssar_split_ag", "dsar_split_ag",
                  "star", "var", "star_hier", "var_hier"]
    opt = DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), algorithm=algorithms[0], density=0.05,
                               schedule=dict(enumerate(algorithms)), selection=Selection(seed=3))
    model = model_with(opt, "mixed_float16")
    probe = OverflowProbe()
    x, y = data(topo.rank, OVERFLOW)
    hist = model.fit(x, y, batch_size=BATCH, epochs=len(algorithms), shuffle=False, verbose=0,
                     callbacks=default_callbacks() + [probe])
    dist = distributed_optimizer(model)
    out = {"optimizer_type": class_name(model.optimizer), "epochs": probe.epochs,
           "iterations": int(model.optimizer.iterations.numpy()),
           "scale": float(model.optimizer.dynamic_scale.numpy()),
           "weights": digest([w.numpy() for w in model.weights]),
           "state_finite": all(np.isfinite(a).all() for a in rank_state(dist)),
           "loss": hist.history["loss"]}
    # the sharded update (ZeRO-1: 2dtar, 16-bit weight deltas, Adam's moments in slices) under the same
    # wrap: the overflowing step is skipped on every rank, the state slices untouched
    # then sharded over a node's ranks: hitopk for epoch 0, 2dtar (fp16) for epoch 1
    for key, schedule in (("sharded", {0: "2dtar"}), ("sharded_node", {0: "hitopk", 1: "2dtar"})):
        sharded = DistributedOptimizer(keras.optimizers.Adam(0.01), algorithm=schedule[0], schedule=schedule,
                                       density=0.05, compression="fp16",
                                       shard_optimizer=True, selection=Selection(seed=3), dgc=DGC(momentum_correction=False))
        model = model_with(sharded, "mixed_float16")
        probe = OverflowProbe()
        hist = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                         callbacks=default_callbacks() + [probe])
        out[key] = {"optimizer_type": class_name(model.optimizer), "epochs": probe.epochs,
                    "iterations": int(model.optimizer.iterations.numpy()),
                    "scale": float(model.optimizer.dynamic_scale.numpy()),
                    "weights": digest([w.numpy() for w in model.weights]),
                    "state_bytes": sharded._sharded.state_bytes(),
                    "unsharded_state_bytes": sharded._sharded.unsharded_state_bytes(), "loss": hist.history["loss"]}
    return out


def forms():
    out = {}
    # DistributedOptimizer around a LossScaleOptimizer: moved outside, with its scale settings
    opt = with_loss_scale(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                                              initial_scale=256.0, dynamic_growth_steps=3),
                          algorithm="hitopk", density=(0.1, 0.02))
    model = model_with(opt, "mixed_float16")
    x, y = data(topo.rank)
    adaptive = AdaptiveDensity(profile_batches(x, y, BATCH), profile_steps=1, verbose=False)
    hist = model.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
                     callbacks=default_callbacks() + [adaptive])
    out["wrapped"] = {"adaptive": [row["density"] for row in adaptive.history],
                      "profiled": [row["density"] for row in adaptive.history[0]["profile"]],
                      "type": class_name(opt), "compiled_is_it": model.optimizer is opt,
                      "inner_type": type(distributed_optimizer(model).inner_optimizer).__name__,
                      "iterations": int(opt.iterations.numpy()), "scale": float(opt.dynamic_scale.numpy()),
                      "weights": digest([w.numpy() for w in model.weights]), "loss": hist.history["loss"]}
    # a custom loop with Keras' own (per-rank) LossScaleOptimizer: refused, not a hang
    keras.mixed_precision.set_global_policy("float32")
    var = keras.Variable(np.ones(4, np.float32))
    plain = keras.optimizers.LossScaleOptimizer(DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm="dense"))
    try:
        plain.apply([tf.ones(4)], [var])
        out["plain_loss_scale"] = "applied"
    except ValueError as e:
        out["plain_loss_scale"] = f"{type(e).__name__}: {e}"
    # fp16 on the wire: every rank's gradient is finite (7e4), their fp16 sum is not (the mean passes
    # 65504): the aggregated check skips the step on every rank, twice; a small gradient then steps
    from tf_commlib.keras import LossScaleOptimizer

    var = keras.Variable(np.ones(4, np.float32))
    wire = LossScaleOptimizer(DistributedOptimizer(keras.optimizers.SGD(1.0), algorithm="dense",
                                                   compression="fp16"), initial_scale=2.0)
    seen, scale = [], 2.0   # the scale the gradients are multiplied by (the initial one, then the wrapper's)
    for g in (7e4, 7e4, 1.0):
        wire.apply([tf.fill([4], float(g) * scale)], [var])
        scale = float(wire.dynamic_scale.numpy())
        seen.append({"var": var.numpy().tolist(), "scale": scale, "iterations": int(wire.iterations.numpy())})
    out["fp16_sum_overflow"] = seen
    # mixed_bfloat16: no loss scaling, trains
    opt = DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), algorithm="hitopk", density=0.05)
    model = model_with(opt, "mixed_bfloat16")
    hist = model.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0, callbacks=default_callbacks())
    out["bf16"] = {"optimizer_is_it": model.optimizer is opt, "compute_dtype": model.layers[0].compute_dtype,
                   "iterations": int(opt.iterations.numpy()), "loss": hist.history["loss"],
                   "weights": digest([w.numpy() for w in model.weights])}
    return out


result = {"collectives": collectives, "forms": forms}[sys.argv[1]]()
print(f"rank {topo.rank}: {sys.argv[1]} took {time.perf_counter() - START:.1f} s after imports", flush=True)
report(topo.rank, result)
