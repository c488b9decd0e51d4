"""tf_commlib.keras.BackupAndRestore's guarantees on 2 ranks:
1. a resumed run starts from exactly the state saved when the first was interrupted (weights and
   every optimizer variable: residuals, DGC momentum, ...) and ends where an uninterrupted run ends;
2. ranks one epoch apart (a job killed while its ranks were saving) resume at one epoch (the rank
   ahead goes back to its previous backup), as BackupAndRestore.resume_epoch says, and end where an
   uninterrupted run ends;
3. ranks two epochs apart raise RuntimeError on every rank (resume_epoch and fit);
4. AdaptiveDensity's choice and state are in the backup: a resumed adaptive run does not re-profile
   and ends where an uninterrupted one ends."""
import os
import shutil
import sys

import keras
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers import _fit
from tests.workers._report import report
from tfc_apps import digits
from tf_commlib import primitives
from tf_commlib.keras import DGC, AdaptiveDensity, BackupAndRestore, DistributedOptimizer, Selection, default_callbacks
from tf_commlib.keras.adaptive import profile_batches

topo = tf_commlib.init()
shared = os.environ["HVD_TEST_OUT"]
(x, y), _ = digits.load(topo.rank, topo.size)
x, y = x[:64], y[:64]
EPOCHS, STOP = 3, 2


def log(what):
    print(f"rank {topo.rank}: {what}", file=sys.stderr, flush=True)


def barrier():
    primitives.allreduce(tf.constant(1), topo.world)


def state(model):
    return [v.numpy() for v in model.weights] + [v.numpy() for v in model.optimizer.variables]


class Record(keras.callbacks.Callback):
    """The state when fit starts (after the restore) and the epochs it runs; with stop, the state
    when epoch stop - 1 ends, then RuntimeError("interrupted")."""

    def __init__(self, stop=None):
        super().__init__()
        self.stop, self.epochs, self.begin, self.end = stop, [], None, None

    def on_train_begin(self, logs=None):
        if self.model.optimizer.built:
            self.begin = state(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)

    def on_epoch_end(self, epoch, logs=None):
        if self.stop and epoch == self.stop - 1:
            self.end = state(self.model)
            raise RuntimeError("interrupted")


def fit(model, extra, epochs=EPOCHS):
    _fit.fit(model, x, y, epochs, 0, extra)


out = {}
full = _fit.build()
fit(full, [])

log("# 1. interru")
# 1. interrupted, then resumed from exactly the saved state
backup = os.path.join(shared, "backup")
first, stopped = _fit.build(), Record(STOP)
try:
    fit(first, [BackupAndRestore(backup), stopped])
except RuntimeError:
    pass
resumed, started = _fit.build(), Record()
fit(resumed, [BackupAndRestore(backup), started])
out["residual"] = sum(float(np.abs(v.numpy()).sum()) for v in first.optimizer.variables if "residual" in v.path)
out["momentum"] = sum(float(np.abs(v.numpy()).sum()) for v in first.optimizer.variables if "dgc_momentum" in v.path)
out["restored_exactly"] = (len(stopped.end) == len(started.begin)
                           and all(np.array_equal(a, b) for a, b in zip(stopped.end, started.begin)))
out["resumed_epochs"] = started.epochs
out["resumed_equals_full"] = _fit.weights(resumed) == _fit.weights(full)
out["deleted"] = not os.path.exists(os.path.join(backup, f"rank{topo.rank}"))

log("# 2. ranks o")
# 2. ranks one epoch apart: rank 0's latest backup is epoch 1, rank 1's epoch 2
skew = os.path.join(shared, "skew")
fit(_fit.build(), [BackupAndRestore(skew, delete_checkpoint=False)], epochs=2)
mine = os.path.join(skew, f"rank{topo.rank}")
if topo.rank == 0:
    for name in ("latest.weights.h5", "training_metadata.json"):
        shutil.copyfile(os.path.join(mine, name + ".bkp"), os.path.join(mine, name))
barrier()
out["skew_resume_epoch"] = BackupAndRestore.resume_epoch(skew)
skewed, started = _fit.build(), Record()
fit(skewed, [BackupAndRestore(skew, delete_checkpoint=False), started])
out["skew_epochs"] = started.epochs
out["skew_equals_full"] = _fit.weights(skewed) == _fit.weights(full)
out["kept"] = os.path.exists(os.path.join(mine, "latest.weights.h5"))

log("# 3. two epo")
# 3. two epochs apart: rank 0 without a backup, rank 1 at epoch 2 (its previous backup: epoch 1)
apart = os.path.join(shared, "apart")
fit(_fit.build(), [BackupAndRestore(apart, delete_checkpoint=False)], epochs=2)
barrier()
if topo.rank == 0:
    shutil.rmtree(os.path.join(apart, "rank0"))
barrier()
errors = []
try:
    BackupAndRestore.resume_epoch(apart)
except RuntimeError as e:
    errors.append(str(e))
try:
    fit(_fit.build(), [BackupAndRestore(apart)])
except RuntimeError as e:
    errors.append(str(e))
out["apart_errors"] = errors


log("# 4. Adaptiv")
# 4. AdaptiveDensity's state
def adaptive_model():
    model = digits.small_cnn(seed=1)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), algorithm="hitopk",
                               density=[0.1, 0.02], dgc=DGC(warmup=1), selection=Selection(seed=5))
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    return model


def adaptive_fit(model, extra):
    cb = AdaptiveDensity(profile_batches(x, y, 16), profile_steps=1, verbose=False)
    model.fit(x, y, batch_size=16, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=default_callbacks() + [cb] + list(extra))
    return cb


def rows(history):
    return [{k: r[k] for k in ("epoch", "density", "profiled", "gain")} for r in history]


adaptive_full = adaptive_model()
full_history = rows(adaptive_fit(adaptive_full, []).history)
adaptive_backup = os.path.join(shared, "adaptive")
try:
    adaptive_fit(adaptive_model(), [BackupAndRestore(adaptive_backup), Record(STOP)])
except RuntimeError:
    pass
adaptive_resumed = adaptive_model()
resumed_history = rows(adaptive_fit(adaptive_resumed, [BackupAndRestore(adaptive_backup)]).history)
out["adaptive_full"], out["adaptive_resumed"] = full_history, resumed_history
out["adaptive_equals_full"] = _fit.weights(adaptive_resumed) == _fit.weights(adaptive_full)
log("report(topo.")
report(topo.rank, out)
