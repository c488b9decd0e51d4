"""DiLoCo on the ranks of an emulated layout. argv[1] "anchor": only the exactness anchor; "all": also the
weights after each sync, the bytes of one interval, the overlap timeline, mixed_float16 skips, a
non-finite pseudo-gradient, a resume from BackupAndRestore, and sync_every="auto"'s choices."""
import hashlib
import os
import sys
import threading

import keras
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers import _fit
from tests.workers._report import report
from tf_commlib import link_bytes
from tf_commlib.keras import (DGC, BackupAndRestore, DiLoCo, DistributedOptimizer, LossScaleOptimizer,
                              default_callbacks)
from tfc_apps import digits

topo = tf_commlib.init()
(x, y), _ = digits.load(topo.rank, topo.size)
x, y = x[:64], y[:64]   # 4 steps of 16 per epoch
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
out = {}


def digest(model, variables=None):
    return hashlib.sha256(b"".join(v.numpy().tobytes() for v in variables or model.variables)).hexdigest()


def flat(model):
    return np.concatenate([v.numpy().ravel() for v in model.weights])


def bn_model(seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((16, 16, 1)), keras.layers.Conv2D(8, 3), keras.layers.BatchNormalization(),
                             keras.layers.ReLU(), keras.layers.Flatten(), keras.layers.Dense(10)])


# -- exactness anchor: H=1, inner SGD, outer SGD lr 1 momentum 0, no overlap == synchronous dense ----
def anchor():
    runs = []
    for make in (lambda: DiLoCo(keras.optimizers.SGD(0.1), sync_every=1, outer_optimizer=keras.optimizers.SGD(1.0),
                                overlap=False),
                 lambda: DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm="dense",
                                              dgc=DGC(momentum_correction=False))):
        model = digits.small_cnn(seed=1)
        model.compile(make(), LOSS, jit_compile=False)
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=default_callbacks())
        runs.append(flat(model))
    out["anchor_diff"] = float(np.abs(runs[0] - runs[1]).max())
    out["anchor_moved"] = float(np.abs(runs[1] - flat(digits.small_cnn(seed=1))).max())


class AtSync(keras.callbacks.Callback):
    """The weights' digest after every batch (after CompressionScheduler's end_step), flagged at syncs."""

    def __init__(self, opt):
        super().__init__()
        self.opt, self.rows = opt, []

    def on_train_batch_end(self, batch, logs=None):
        steps = int(self.opt.steps_done.numpy())
        self.rows.append([steps, steps == int(self.opt.synced_at.numpy()), digest(self.model),
                          digest(self.model, self.model.trainable_variables)])

    def on_epoch_end(self, epoch, logs=None):   # after CompressionScheduler's sync
        self.rows.append([int(self.opt.steps_done.numpy()), True, digest(self.model),
                          digest(self.model, self.model.trainable_variables)])


def syncs():
    """H=3 with momentum and batch norm, 4 steps per epoch: syncs at steps 3, 4 (epoch end), 6, 8 (epoch end)."""
    model = bn_model()
    global fixed_opt
    opt = fixed_opt = DiLoCo(keras.optimizers.SGD(0.05, momentum=0.9), sync_every=3, overlap=False)
    model.compile(opt, LOSS, jit_compile=False)
    at = AtSync(opt)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=default_callbacks() + [at])
    out["rows"] = at.rows
    out["bn_mean"] = model.layers[1].moving_mean.numpy().tolist()


def step_fn(model, opt):
    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return step


def interval_bytes():
    """One interval of a custom loop counted by the primitives against interval_bytes()."""
    for compression in (None, "qsgd8", "int4"):
        model = digits.small_cnn(seed=1)
        opt = DiLoCo(keras.optimizers.SGD(0.05), sync_every=3, inter_compression=compression, overlap=False)
        step = step_fn(model, opt)
        with link_bytes.counting() as counter:
            for i in range(3):
                step(x[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)])
                opt.end_step()
            out[f"counted_{compression}"] = counter.result()
        out[f"formula_{compression}"] = opt.interval_bytes()
        out[f"synced_{compression}"] = int(opt.synced_at.numpy())
    # the inter-node mean in int4 (rounding without randomness): the mean over the nodes of what each
    # node's slice decodes to, computed here from every node's slice; this rank's own message besides
    from tf_commlib.collectives import codec
    from tf_commlib.inter_mean import inter_mean

    def shard(node):
        return np.random.default_rng([node, topo.local]).standard_normal(3000).astype(np.float32)

    wire = codec.get("int4")
    mean, own = inter_mean(tf.constant(shard(topo.node)), topo, wire, seed=0, name="diloco_int4_check")
    rounded = [wire.decode(wire.encode(tf.constant(shard(j))), 3000).numpy() for j in range(topo.m)]
    out["int4_mean_error"] = float(np.abs(mean.numpy() - np.mean(rounded, axis=0)).max())
    out["int4_own_error"] = float(np.abs(own.numpy() - rounded[topo.node]).max())
    out["int4_rounding"] = float(np.abs(rounded[topo.node] - shard(topo.node)).max())


def overlap():
    """overlap=True: the exchange of a sync starts before the next inner step ends; synchronize() gives
    every rank the same weights."""
    model = digits.small_cnn(seed=1)
    opt = DiLoCo(keras.optimizers.SGD(0.05), sync_every=2, inter_compression="fp16")
    opt.timeline = []
    gate, released, exchange = threading.Event(), [], opt._exchange

    def gated(shard, index):   # sync 1's exchange waits until step 3 has ended: only overlap gets there
        if index == 1:
            released.append(gate.wait(60))
        return exchange(shard, index)

    object.__setattr__(opt, "_exchange", gated)
    step = step_fn(model, opt)
    for i in range(7):
        step(x[16 * (i % 4):16 * (i % 4 + 1)], y[16 * (i % 4):16 * (i % 4 + 1)])
        opt.end_step()
        if i == 2:
            gate.set()
    out["released"] = released
    out["between_syncs"] = digest(model)
    opt.synchronize()
    out["timeline"] = opt.timeline
    out["overlap_final"] = digest(model)


def linear():
    """Constant gradients c_rank (a linear loss), inner SGD lr 0.1, outer SGD lr 1 momentum 0, H=3, 7 steps,
    then synchronize(): with and without overlap every rank ends at w0 - 0.1 * 7 * mean(c) (the overlapped
    syncs apply each interval once, one late; the epoch-end sync adds the last, partial interval)."""
    c = [np.arange(5, dtype=np.float32) * (r + 1) - r for r in range(topo.size)]
    expected = -0.1 * 7 * np.mean(c, axis=0)
    for overlap in (False, True):
        w = keras.Variable(np.zeros(5, np.float32), name="w")
        opt = DiLoCo(keras.optimizers.SGD(0.1), sync_every=3, outer_optimizer=keras.optimizers.SGD(1.0),
                     overlap=overlap)
        for _ in range(7):
            opt.apply([tf.constant(c[topo.rank])], [w])
            opt.end_step()
        out[f"linear_partial_{overlap}"] = w.numpy().tolist()
        opt.synchronize()
        out[f"linear_{overlap}"] = float(np.abs(w.numpy() - expected).max())


def mixed():
    """mixed_float16, rank 0 overflows at step 2: its node skips it, the other node steps, nothing crosses
    nodes outside syncs; a NaN in node 1's weights at a sync: every rank skips that outer step."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = digits.small_cnn(seed=1)
        opt = LossScaleOptimizer(DiLoCo(keras.optimizers.SGD(0.05), sync_every=4, overlap=False))
        inner = opt.inner_optimizer
        blow = tf.Variable(1.0)

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = LOSS(yb, model(xb, training=True)) * blow
                scaled = opt.scale_loss(loss)
            opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)

        digests, inter, scales = [], [], []
        for i in range(8):
            blow.assign(np.inf if (i == 1 and topo.rank == 0) else 1.0)
            if i == 7 and topo.node == 1:
                model.trainable_variables[0].assign(model.trainable_variables[0] * np.nan)
            with link_bytes.counting() as counter:
                step(x[16 * (i % 4):16 * (i % 4 + 1)], y[16 * (i % 4):16 * (i % 4 + 1)])
                inner.end_step()
                inter.append(counter.result()["inter"])
            digests.append(digest(model))
            scales.append(float(opt.dynamic_scale.numpy()))
        out["mixed_digests"], out["mixed_inter"], out["mixed_scales"] = digests, inter, scales
        out["mixed_scale"] = float(opt.dynamic_scale.numpy())
        out["mixed_start_digest"] = hashlib.sha256(b"".join(v.numpy().tobytes() for v in inner.starts)).hexdigest()
        out["mixed_finite"] = bool(all(np.isfinite(v.numpy()).all() for v in model.weights))
        per_rank = keras.optimizers.LossScaleOptimizer(DiLoCo(keras.optimizers.SGD(0.05), sync_every=4))
        try:
            per_rank.apply([tf.ones(v.shape, v.dtype) for v in model.trainable_variables], model.trainable_variables)
        except ValueError as e:
            out["per_rank_check"] = str(e)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def resume():
    """overlap=True, H=3, batch norm: interrupted in epoch 2 between syncs and resumed from
    BackupAndRestore by a new model and optimizer, bit-identical to an uninterrupted run."""
    def build():
        keras.backend.clear_session()
        model = bn_model()
        model.compile(DiLoCo(keras.optimizers.SGD(0.05, momentum=0.9), sync_every=3, inter_compression="qsgd8"),
                      LOSS, jit_compile=False)
        return model

    def fit(model, extra=()):
        model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0, callbacks=default_callbacks() + list(extra))

    full = build()
    fit(full)
    backup = os.path.join(os.environ["HVD_TEST_OUT"], "backup")

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if self.model.optimizer.steps_done.numpy() == 7:   # syncs at 3, 4, 6, 8, ...
                raise RuntimeError("interrupted")

    # BackupAndRestore before the default callbacks: it saves before CompressionScheduler's epoch-end sync
    # and restores before it has passed the statistics: both must still hold the whole state
    try:
        build().fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0,
                    callbacks=[BackupAndRestore(backup)] + default_callbacks() + [Stop()])
    except RuntimeError as e:
        out["interrupted"] = str(e)
    resumed = build()
    resumed.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0,
                callbacks=[BackupAndRestore(backup)] + default_callbacks())
    out["resume_full"], out["resume_resumed"] = digest(full), digest(resumed)
    out["resume_steps"] = int(resumed.optimizer.steps_done.numpy())


fixed_opt = None   # syncs()' optimizer (H = 3)


def auto_interval():
    """sync_every="auto", 8-bit, 4 epochs of 4 steps: H starts at AUTO_START; each decision's H and the
    numbers it was made from, the H of each epoch, and the weights at the end."""
    model = bn_model()
    opt = DiLoCo(keras.optimizers.SGD(0.05, momentum=0.9), sync_every="auto", inter_compression="qsgd8")
    model.compile(opt, LOSS, jit_compile=False)
    model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0, callbacks=default_callbacks())
    out["auto_log"] = opt.interval_log
    out["auto_epochs"] = [opt.interval_at(e) for e in range(4)]
    out["auto_algorithms"] = [opt.algorithm_at(e) for e in range(4)]
    out["auto_final"] = digest(model)
    out["interval_variables"] = {kind: [v.name for v in o.variables if v.name == "diloco_interval"]
                                 for kind, o in (("auto", opt), ("fixed", fixed_opt))}


anchor()
if sys.argv[1] == "all":
    syncs()
    auto_interval()
    interval_bytes()
    overlap()
    linear()
    mixed()
    resume()
report(topo.rank, out)
