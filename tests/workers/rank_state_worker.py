"""Per-rank optimizer state across a restart, on 4 ranks: tf_commlib.keras.BackupAndRestore (one
backup per rank in a shared directory) resumes to the same weights as an uninterrupted run, and a
checkpoint written by rank 0 alone and loaded by every rank is refused on every rank."""
import os

import keras
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers import _fit
from tests.workers._mixed import rank_values
from tests.workers._report import report
from tfc_apps import digits
from tf_commlib import costmodel, primitives
from tf_commlib.keras import BackupAndRestore, average_variables, broadcast_variables

topo = tf_commlib.init()
shared = os.environ["HVD_TEST_OUT"]
(x, y), _ = digits.load(topo.rank, topo.size)
x, y = x[:64], y[:64]
EPOCHS, STOP = 3, 1


def fit(model, epochs, initial_epoch=0, extra=()):
    _fit.fit(model, x, y, epochs, initial_epoch, extra)


full = _fit.build()
fit(full, EPOCHS)
residual = sum(float(np.abs(v.numpy()).sum()) for v in full.optimizer.variables if "residual" in v.path)

backup = os.path.join(shared, "backup")   # one directory for all ranks
first = _fit.build()
try:
    fit(first, EPOCHS, extra=[BackupAndRestore(backup), _fit.Interrupt(STOP)])
except RuntimeError:
    pass
mine = os.path.join(backup, f"rank{topo.rank}", "latest.weights.h5")
backed_up = os.path.exists(mine)
resumed = _fit.build()
fit(resumed, EPOCHS, extra=[BackupAndRestore(backup)])

# The usual Horovod practice: rank 0 alone saves; every rank loads rank 0's file.
part = _fit.build()
fit(part, STOP)
path = os.path.join(shared, "rank0.keras")
if topo.rank == 0:
    part.save(path)
primitives.allreduce(tf.constant(1), topo.world)   # the file is there before anyone reads it
loaded = keras.models.load_model(path)
try:
    fit(loaded, EPOCHS, initial_epoch=STOP)
    refused = None
except (ValueError, tf.errors.OpError) as e:
    refused = str(e)
loaded = keras.models.load_model(path)
loaded.optimizer.reset_rank_state()   # knowingly start residuals and momentum from zero
fit(loaded, STOP + 1, initial_epoch=STOP)

# broadcast_variables / average_variables pack the variables per dtype: mixed dtypes and shapes.
mixed = [keras.Variable(v) for v in rank_values(topo.rank)]
sent = broadcast_variables(mixed, root_rank=1)
sent_again = broadcast_variables(mixed, root_rank=1)   # now the same on every rank: nothing sent
# float32 the same on every rank but rank 2's second value, int64 and float64 the same everywhere
partly = [keras.Variable(np.float32([1, 2 + (topo.rank == 2)])), keras.Variable(np.int64(7)),
          keras.Variable(3.0, dtype="float64")]
sent_partly = broadcast_variables(partly, root_rank=0)
try:
    broadcast_variables(mixed, root_rank=topo.size)
    bad_root = None
except ValueError as e:
    bad_root = str(e)
floats = [keras.Variable(v) for v in rank_values(topo.rank) if v.dtype.kind == "f"]
average_variables(floats)
# costmodel.cached_values: measured on every rank, rank 0's kept; read back on every rank in one all-gather
values_path, values_key = os.path.join(shared, "values.json"), costmodel.calibration_key(topo, {"case": "values"})
measured = costmodel.cached_values(topo, values_path, values_key, lambda: [1.5, 2.0 + topo.rank])
read_back = costmodel.cached_values(topo, values_path, values_key, lambda: [9.0])
report(topo.rank, {"full": _fit.weights(full), "resumed": _fit.weights(resumed), "backed_up": backed_up,
                   "deleted": not os.path.exists(mine), "measured": measured, "read_back": read_back,
                   "residual": residual, "refused": refused, "after_reset": _fit.weights(loaded),
                   "broadcast": [np.asarray(v.numpy()).tolist() for v in mixed],
                   "broadcast_dtypes": [str(v.dtype) for v in mixed], "sent": sent, "sent_again": sent_again,
                   "sent_partly": sent_partly, "partly": [np.asarray(v.numpy()).tolist() for v in partly],
                   "bad_root": bad_root,
                   "averaged": [np.asarray(v.numpy()).tolist() for v in floats]})
