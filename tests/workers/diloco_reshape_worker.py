"""DiLoCo(sync_every="auto") on the emulated 2x2 cluster while its inter-node link is re-shaped: 2 epochs at
the first rate, then rank 0 asks the test to re-shape the link (a file in HVD_TEST_OUT) and waits until it
has, then 3 more epochs. Reports each choice of H with the times it was made from, and the weights."""
import hashlib
import os
import time

import keras

import tf_commlib
from tests.workers._report import report
from tf_commlib.keras import DiLoCo, default_callbacks
from tfc_apps import digits

topo = tf_commlib.init()
out_dir = os.environ["HVD_TEST_OUT"]
(x, y), _ = digits.load(topo.rank, topo.size)
x, y = x[:160], y[:160]   # 10 steps of 16 per epoch
keras.utils.set_random_seed(1)   # a wide layer: 1 MB of weights, whose pseudo-gradient the link decides
model = keras.Sequential([keras.Input((16, 16, 1)), keras.layers.Flatten(), keras.layers.Dense(1024, activation="relu"),
                          keras.layers.Dense(10)])
opt = DiLoCo(keras.optimizers.SGD(0.05, momentum=0.9), sync_every="auto")
model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)


class Reshape(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):   # after CompressionScheduler's sync and choice
        if epoch == 1 and topo.rank == 0:   # the others wait in the next sync's exchange
            open(os.path.join(out_dir, "reshape.request"), "w").close()
            while not os.path.exists(os.path.join(out_dir, "reshape.done")):
                time.sleep(0.05)


model.fit(x, y, batch_size=16, epochs=5, verbose=0, callbacks=default_callbacks() + [Reshape()])
report(topo.rank, {"log": opt.interval_log, "epochs": [opt.interval_at(e) for e in range(5)],
                   "final": hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.variables)).hexdigest()})
