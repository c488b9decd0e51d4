"""DistributedOptimizer(algorithm="auto")'s candidate "diloco" on an emulated 2x2 layout, where a slow link
given in Auto(cost_params=...) makes it the choice: the weights it trains against tf_commlib.keras.DiLoCo
with the same settings, every rank's weights after each epoch, the bytes of its steps and syncs, a resume
from BackupAndRestore, and the switch back to a per-step collective once the link is fast."""
import hashlib
import sys

import keras
import numpy as np

import tf_commlib
from tests.workers._report import report
from tf_commlib import alphabeta, link_bytes
from tf_commlib.aggregator import Auto
from tf_commlib.keras import DGC, BackupAndRestore, DiLoCo, DistributedOptimizer, default_callbacks
from tf_commlib.auto import rounds
from tfc_apps import digits

topo = tf_commlib.init()
(x, y), _ = digits.load(topo.rank, topo.size)
x, y = x[:64], y[:64]   # 16 steps of 4 per epoch
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
SLOW = alphabeta.LinkParams(beta_inter=8 / 1e6)   # 1 Mbit/s between nodes
out = {}


def digest(variables):
    return hashlib.sha256(b"".join(v.numpy().tobytes() for v in variables)).hexdigest()


def flat(model):
    return np.concatenate([v.numpy().ravel() for v in model.trainable_weights])


def auto_optimizer(link=SLOW):
    """auto on the given link (not measured again: the ranks' shared cores move the step times)."""
    return DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), dgc=DGC(momentum_correction=False),
                                auto=Auto(cost_params=link, compute_s=0.01, probe=False, drift=1e9))


class Digests(keras.callbacks.Callback):
    """Every rank's weights after each epoch (after CompressionScheduler's sync), and the bytes the
    primitives count over H steps of epoch 1 (after CompressionScheduler's end_step: H steps, one sync;
    the counter is fit's, which the step was traced with, reset at the window's start)."""

    def __init__(self, opt, counter):
        super().__init__()
        self.opt, self.counter, self.rows, self.counted = opt, counter, [], None

    def on_train_batch_begin(self, batch, logs=None):
        if self.model.optimizer.iterations.numpy() == 16:   # epoch 1's first step
            self.counter.reset()

    def on_train_batch_end(self, batch, logs=None):
        if self.model.optimizer.iterations.numpy() == 16 + self.opt.auto_epochs.local.interval:
            self.counted = self.counter.result()

    def on_epoch_end(self, epoch, logs=None):
        self.rows.append(digest(self.model.trainable_weights))


def against_diloco():
    model = digits.small_cnn(seed=1)
    opt = auto_optimizer()
    model.compile(opt, LOSS, jit_compile=False)
    with link_bytes.counting() as counter:
        seen = Digests(opt, counter)
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=default_callbacks() + [seen])
    out["counted"] = seen.counted
    local = opt.auto_epochs.local
    out["ran"] = [opt.algorithm_at(e) for e in range(2)]
    out["h"] = local.interval
    out["syncs"] = int(local.synced_at.numpy())
    out["formula"] = {k: local.interval * v for k, v in local.sent_bytes().items()}
    out["digests"] = seen.rows
    out["outer_saved"] = len(local.outer_optimizer.variables) > 0 and all(
        any(v is w for w in opt.variables) for v in local.outer_optimizer.variables)
    reference = digits.small_cnn(seed=1)
    reference.compile(DiLoCo(keras.optimizers.SGD(0.05, momentum=0.9), sync_every=local.interval,
                             outer_optimizer=keras.optimizers.SGD(1.0), inter_compression=rounds.CODEC,
                             overlap=False), LOSS, jit_compile=False)
    reference.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=default_callbacks())
    out["diff"] = float(np.abs(flat(model) - flat(reference)).max())
    out["moved"] = float(np.abs(flat(model) - flat(digits.small_cnn(seed=1))).max())


def resume(backup_dir):
    """3 epochs in one fit, against 2 epochs, then a new model resumed from their backup for the third."""
    def fit(epochs):
        model = digits.small_cnn(seed=2)
        model.compile(auto_optimizer(), LOSS, jit_compile=False)
        model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0,
                  callbacks=default_callbacks() + [BackupAndRestore(backup_dir, delete_checkpoint=False)])
        return model

    whole = digits.small_cnn(seed=2)
    whole.compile(auto_optimizer(), LOSS, jit_compile=False)
    whole.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0, callbacks=default_callbacks())
    fit(2)
    resumed = fit(3)
    out["resume_diff"] = float(np.abs(flat(whole) - flat(resumed)).max())
    out["resumed_ran"] = [distributed(resumed).algorithm_at(e) for e in range(3)]


def distributed(model):
    from tf_commlib.keras import distributed_optimizer
    return distributed_optimizer(model)


def leave():
    """A schedule that leaves "auto" after epoch 0, which ran "diloco": epoch 1 runs 2dtar, and every rank
    ends with the same weights and the same momentum of the wrapped SGD (which stepped per node before)."""
    model = digits.small_cnn(seed=4)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), dgc=DGC(momentum_correction=False),
                               schedule={0: "auto", 1: "2dtar"},
                               auto=Auto(cost_params=SLOW, compute_s=0.01, probe=False, drift=1e9, diloco=True))
    model.compile(opt, LOSS, jit_compile=False)
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=default_callbacks())
    out["leave_ran"] = [opt.algorithm_at(e) for e in range(2)]
    out["leave_running"] = opt.auto_epochs.local.running
    out["leave_digest"] = digest(model.trainable_weights + opt.inner_optimizer.variables)


def leave_resumed(backup_dir):
    """The same, resumed from the backup of a "diloco" epoch that is not the first: epoch 0 runs 2dtar,
    epoch 1 "auto" ("diloco"), then the run resumes into the scheduled 2dtar epoch. Every rank restores
    its own backup, whose wrapped SGD momentum differs by node: the epoch starts from it averaged, and
    every rank ends with the same weights and momentum."""
    def fit(epochs):
        model = digits.small_cnn(seed=6)
        opt = DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), dgc=DGC(momentum_correction=False),
                                   schedule={0: "2dtar", 1: "auto", 2: "2dtar"},
                                   auto=Auto(cost_params=SLOW, compute_s=0.01, probe=False, drift=1e9, diloco=True))
        model.compile(opt, LOSS, jit_compile=False)
        model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0,
                  callbacks=default_callbacks() + [BackupAndRestore(backup_dir, delete_checkpoint=False)])
        return model, opt

    fit(2)
    model, opt = fit(3)
    out["resumed_leave_ran"] = [opt.algorithm_at(e) for e in range(3)]
    out["resumed_leave_digest"] = digest(model.trainable_weights + opt.inner_optimizer.variables)


def mixed():
    """mixed_float16 (compile puts a LossScaleOptimizer around it, made global by default_callbacks()): the
    epochs run "diloco", the weights stay finite and every rank ends with the same ones."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = digits.small_cnn(seed=5)
        opt = auto_optimizer()
        model.compile(opt, LOSS, jit_compile=False)
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=default_callbacks())
        out["mixed_ran"] = [opt.algorithm_at(e) for e in range(2)]
        out["mixed_finite"] = bool(np.isfinite(flat(model)).all())
        out["mixed_moved"] = float(np.abs(flat(model) - flat(digits.small_cnn(seed=5))).max())
        out["mixed_digest"] = digest(model.trainable_weights)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def fast_link():
    """A 10 Gbit/s link: a per-step collective runs; every rank's weights are the same after the epoch."""
    model = digits.small_cnn(seed=3)
    opt = auto_optimizer(alphabeta.LinkParams())
    model.compile(opt, LOSS, jit_compile=False)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=default_callbacks())
    out["fast_ran"] = opt.algorithm_at(0)
    out["fast_digest"] = digest(model.trainable_weights)


against_diloco()
resume(sys.argv[1])
leave()
leave_resumed(sys.argv[1] + "_leave")
mixed()
fast_link()
report(topo.rank, out)
