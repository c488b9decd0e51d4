"""The epoch policy reaches the collectives from the first step of model.fit: the DGC warm-up
density of epoch 0, and a resumed run's epoch (set before the optimizer exists) for both the
density and the scheduled algorithm. Keras builds the optimizer while tracing the first step."""
import keras
import numpy as np

import tf_commlib
from tests.workers._report import report
from tf_commlib.keras import DGC, DistributedOptimizer, default_callbacks

topo = tf_commlib.init()
x = np.random.default_rng(topo.rank).normal(size=(32, 20)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
out = {}
for initial_epoch in (0, 3):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(200), keras.layers.Dense(3)])
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), algorithm="hitopk", density=0.01,
                               schedule={0: "hitopk", 3: "naive_ag"}, dgc=DGC(warmup=2))
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    seen = []

    class Probe(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            agg = opt._groups[0].aggregator   # the sparse group (the 20x200 kernel)
            seen.append([float(agg.density.numpy()), agg.candidates[int(agg.active.numpy())]])

    model.fit(x, y, batch_size=8, epochs=initial_epoch + 1, initial_epoch=initial_epoch, verbose=0,
              callbacks=default_callbacks() + [Probe()])
    out[str(initial_epoch)] = seen
report(topo.rank, out)
