"""DistributedOptimizer(algorithm="auto") on the emulated 2x2 cluster while its inter-node link is
re-shaped: calibrated at the start, 2 epochs at the first rate, then rank 0 asks the test to
re-shape the link (a file in HVD_TEST_OUT) and waits until it has, then 3 more epochs. Reports the
choice of every epoch, the recalibrations and the link parameters before and after."""
import os
import time

import keras

import tf_commlib
from tests.workers._report import report
from tf_commlib import costmodel
from tf_commlib.aggregator import Auto
from tf_commlib.auto.decide import TimeToAccuracy
from tf_commlib.fusion import DEFAULT_THRESHOLD_BYTES
from tf_commlib.keras import DGC, DistributedOptimizer, default_callbacks
from tfc_apps import digits

topo = tf_commlib.init()
out_dir = os.environ["HVD_TEST_OUT"]
(x, y), _ = digits.load(topo.rank, topo.size)
x, y = x[:160], y[:160]
keras.utils.set_random_seed(1)   # a wide layer: 1 MB of gradients, whose exchange the link decides
model = keras.Sequential([keras.Input((16, 16, 1)), keras.layers.Flatten(), keras.layers.Dense(1024, activation="relu"),
                          keras.layers.Dense(10)])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
largest = max(DEFAULT_THRESHOLD_BYTES // 4, max(int(w.shape.num_elements()) for w in model.trainable_weights))
started = time.perf_counter()
link = costmodel.calibrate(topo, **costmodel.sizes_for(largest))
compute_s = costmodel.compute_seconds(topo, model, x[:16], y[:16], loss)
calibration_s = time.perf_counter() - started
# no DGC warm-up (auto's default has 2 epochs): a ratio is compared across epochs of one density
# only, and the link changes after epoch 1. dense and hitopk at density 0.25 only: this model's compute
# is a few ms, so DiLoCo rounds (every 8 steps across nodes) or a sparser candidate would be predicted
# the fastest on either link; at 0.25 hitopk sends half of dense's bytes, within the noise on the fast
# link (dense runs) and well below on the slow one
opt = DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), algorithm="auto", dgc=DGC(), density=0.25,
                           auto=Auto(cost_params=link, compute_s=compute_s, candidates=("dense", "hitopk"),
                                     diloco=False))
model.compile(opt, loss, jit_compile=False)


class Reshape(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1 and topo.rank == 0:   # the others wait in the next step's collectives
            open(os.path.join(out_dir, "reshape.request"), "w").close()
            while not os.path.exists(os.path.join(out_dir, "reshape.done")):
                time.sleep(0.05)


started = time.perf_counter()
model.fit(x, y, batch_size=16, epochs=5, verbose=0, callbacks=default_callbacks() + [Reshape()])
auto = opt.auto_epochs
# what a run starting on the new link would choose first: the same predictions, nothing measured yet
fresh = TimeToAccuracy(auto.tta.candidates, auto.tta.lossy).choose(
    [(None, {c: auto.step_s(c, opt.density_at(4)) for c in auto.tta.candidates})])
report(topo.rank, {"choices": [row["choice"] for row in auto.tta.log if "choice" in row], "from_scratch": fresh,
                   "log": auto.tta.log, "recalibrations": auto.recalibrations,
                   "beta_inter": [link.beta_inter, auto.link.beta_inter],
                   "calibration_s": calibration_s, "fit_s": time.perf_counter() - started})
