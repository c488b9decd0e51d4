"""Training stopped after epoch 2 and resumed (BackupAndRestore, and tf.train.Checkpoint) must end
with the same weights as an uninterrupted run: residuals and DGC momentum are in the state."""
import os

import keras
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers import _fit
from tests.workers._report import report
from tf_commlib.keras import DGC
from tfc_apps import digits

topo = tf_commlib.init()
work = os.path.join(os.environ["HVD_TEST_OUT"], f"rank{topo.rank}")
(x, y), _ = digits.load(topo.rank, topo.size)
x, y = x[:160], y[:160]
EPOCHS, STOP = 4, 2


def build():
    return _fit.build(dgc=DGC(warmup=1))


def fit(model, epochs, initial_epoch=0, extra=()):
    _fit.fit(model, x, y, epochs, initial_epoch, extra)


full = build()
fit(full, EPOCHS)
state = {v.path: v.numpy() for v in full.optimizer.variables}
has_residual = any("residual" in p and np.abs(v).sum() > 0 for p, v in state.items())
has_momentum = any("dgc_momentum" in p and np.abs(v).sum() > 0 for p, v in state.items())

# 1. Keras BackupAndRestore: interrupted run, then a fresh model resumes from the backup.
backup = os.path.join(work, "backup")
first = build()
try:
    fit(first, EPOCHS, extra=[keras.callbacks.BackupAndRestore(backup), _fit.Interrupt(STOP)])
except RuntimeError:
    pass
resumed = build()
fit(resumed, EPOCHS, extra=[keras.callbacks.BackupAndRestore(backup)])

# 2. tf.train.Checkpoint of model and optimizer after epoch 2, restored into a fresh model.
part = build()
fit(part, STOP)
path = tf.train.Checkpoint(model=part, optimizer=part.optimizer).save(os.path.join(work, "ckpt"))
restored = build()
restored.optimizer.build(restored.trainable_variables)
tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).restore(path).assert_consumed()
fit(restored, EPOCHS, initial_epoch=STOP)

# 3. Keras model.save / load_model of the whole model, optimizer state included.
saved = os.path.join(work, "model.keras")
part.save(saved)
loaded = keras.models.load_model(saved)
fit(loaded, EPOCHS, initial_epoch=STOP)

report(topo.rank, {"saved": _fit.weights(loaded), "loaded_optimizer": type(loaded.optimizer).__name__,"full": _fit.weights(full), "backup": _fit.weights(resumed), "checkpoint": _fit.weights(restored),
                   "has_residual": bool(has_residual), "has_momentum": bool(has_momentum),
                   "partial": _fit.weights(part)})
