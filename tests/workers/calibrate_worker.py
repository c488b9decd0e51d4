"""Runs costmodel.calibrate() on every rank and reports the numbers and the choices they give; then
costmodel.compute_seconds of a small model, on batches of different sizes per rank."""
import keras
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tf_commlib import collectives, costmodel

topo = tf_commlib.init()
params = costmodel.calibrate(topo, sizes=(2**14, 2**17), repeats=3, compute_sizes=(2**16, 2**18))
model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(16, 3), keras.layers.Flatten(),
                          keras.layers.Dense(10)])
batch = 8 * (1 + topo.rank)   # the ranks' own times differ; every rank must return the same number
compute = costmodel.compute_seconds(topo, model, tf.random.normal((batch, 16, 16, 3)),
                                    tf.one_hot(tf.range(batch) % 10, 10),
                                    keras.losses.CategoricalCrossentropy(from_logits=True), repeats=3)
sizes = [2**10, 2**16, 2**20, 2**24, 2**26]
report(topo.rank, {
    "m": topo.m, "n": topo.n, "compute_s": compute,
    "params": params.as_list(),
    "curve": [list(row) for row in params.compute_curve],
    "choices": [collectives.choose(d, topo.m, topo.n, 0.01, params) for d in sizes],
    "predicted": [collectives.predict("hitopk", d, topo.m, topo.n, 0.01, params) for d in sizes],
})
