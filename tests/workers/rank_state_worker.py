"""Per-rank optimizer state across a restart, on 4 ranks: tf_commlib.keras.BackupAndRestore (one
backup per rank in a shared directory) resumes to the same weights as an uninterrupted run, and a
checkpoint written by rank 0 alone and loaded by every rank is refused on every rank."""
import os
import sys

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import tf_commlib  # noqa: E402
from _report import report  # noqa: E402
from tf_commlib import digits  # noqa: E402
from tf_commlib import primitives as P  # noqa: E402
from tf_commlib.keras import BackupAndRestore, DistributedOptimizer, default_callbacks  # noqa: E402

topo = tf_commlib.init()
shared = os.environ["HVD_TEST_OUT"]
(x, y), _ = digits.load(topo.rank, topo.size)
x, y = x[:64], y[:64]
EPOCHS, STOP = 3, 1


def build():
    model = digits.small_cnn(seed=1)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), algorithm="hitopk",
                               density=0.05, seed=5)
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    return model


def fit(model, epochs, initial_epoch=0, extra=()):
    model.fit(x, y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False,
              verbose=0, callbacks=default_callbacks() + list(extra))


def weights(model):
    return np.concatenate([w.numpy().ravel() for w in model.weights]).tolist()


class Interrupt(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == STOP - 1:
            raise RuntimeError("interrupted")


full = build()
fit(full, EPOCHS)
residual = sum(float(np.abs(v.numpy()).sum()) for v in full.optimizer.variables if "residual" in v.path)

backup = os.path.join(shared, "backup")   # one directory for all ranks
first = build()
try:
    fit(first, EPOCHS, extra=[BackupAndRestore(backup), Interrupt()])
except RuntimeError:
    pass
backups = sorted(os.listdir(backup))
resumed = build()
fit(resumed, EPOCHS, extra=[BackupAndRestore(backup)])

# The usual Horovod practice: rank 0 alone saves; every rank loads rank 0's file.
part = build()
fit(part, STOP)
path = os.path.join(shared, "rank0.keras")
if topo.rank == 0:
    part.save(path)
P.allreduce(tf.constant(1), topo.world)   # the file is there before anyone reads it
loaded = keras.models.load_model(path)
try:
    fit(loaded, EPOCHS, initial_epoch=STOP)
    refused = None
except (ValueError, tf.errors.OpError) as e:
    refused = str(e)
loaded = keras.models.load_model(path)
loaded.optimizer.reset_rank_state()   # knowingly start residuals and momentum from zero
fit(loaded, STOP + 1, initial_epoch=STOP)
report(topo.rank, {"full": weights(full), "resumed": weights(resumed), "backups": backups,
                   "residual": residual, "refused": refused, "after_reset": weights(loaded)})
