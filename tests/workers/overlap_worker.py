"""Overlap of aggregation with backprop in model.fit (graph mode): a model whose first layer is
expensive in backward, one bucket per variable (fusion_threshold_bytes=1), a Timeline on the
DistributedOptimizer. Reports, per step and per case, when each gradient reached apply() and when
each bucket's aggregation started, with which bucket holds which variable (tests/test_overlap.py).
argv: the algorithms of the sparse group to run, e.g. hitopk dense; "clip:<algorithm>" adds
local_clip_norm (a global barrier: the negative control); "serial:<algorithm>" sets overlap=False
(aggregation after backprop, the other negative control); "mixed:<algorithm>" trains under the
mixed_float16 policy with loss scaling (tf_commlib.keras.LossScaleOptimizer around the
DistributedOptimizer); "shard:<algorithm>" shards the optimizer update (shard_optimizer=True: dense
reduce-scattered over all ranks, hitopk's node slices)."""
import hashlib
import sys
import time

import keras
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import tf_commlib  # noqa: E402
from _report import report  # noqa: E402
from tf_commlib.keras import DGC, DistributedOptimizer, Selection, distributed_optimizer, with_loss_scale  # noqa: E402
from tf_commlib.overlap import Timeline  # noqa: E402

topo = tf_commlib.init()
STEPS, BATCH = 4, 8


def model_for(case):
    clip, serial, mixed, shard = (case.startswith(p) for p in ("clip:", "serial:", "mixed:", "shard:"))
    algorithm = case.split(":")[-1]
    keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((32, 32, 16)),
        keras.layers.Conv2D(64, 5, padding="same", activation="relu"),   # expensive in backward
        keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(64, activation="relu"),
        # its kernel (2560 entries) in the sparse group, its bias in the dense one
        keras.layers.Dense(40, dtype="float32"),
    ])
    sgd = keras.optimizers.SGD(0.01, momentum=0.9)
    options = dict(algorithm=algorithm, density=0.1, fusion_threshold_bytes=1, overlap=not serial,
                   shard_optimizer=shard, selection=Selection(seed=3), dgc=DGC(local_clip_norm=1.0 if clip else None))
    opt = (with_loss_scale(keras.optimizers.LossScaleOptimizer(sgd), **options) if mixed
           else DistributedOptimizer(sgd, **options))
    distributed_optimizer(opt).timeline = Timeline()
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    return model, distributed_optimizer(opt)


class Record(keras.callbacks.Callback):
    def __init__(self, timeline):
        super().__init__()
        self.timeline, self.steps = timeline, []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append([[list(k), t] for k, t in self.timeline.times().items()])


rng = np.random.default_rng(0)   # the same data on every rank: the replicas must stay identical
x = rng.standard_normal((STEPS * BATCH, 64, 64, 16)).astype(np.float32)   # the first conv's backward: tens of ms
y = rng.integers(0, 40, STEPS * BATCH)
out = {"rank": topo.rank, "cases": {}, "seconds": {"start": time.perf_counter()}}
for case in sys.argv[1:]:
    model, opt = model_for(case)
    record = Record(opt.timeline)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[record])
    groups = [{"tag": tag, "variables": list(g.indices),
               "buckets": [list(b.positions) for b in g.aggregator.buckets]}
              for tag, g in enumerate(opt._groups)]
    digest = hashlib.sha256(b"".join(w.numpy().tobytes() for w in model.weights)).hexdigest()
    out["cases"][case] = {"steps": record.steps, "groups": groups, "n_variables": len(model.trainable_variables),
                          "weights": digest}
    out["seconds"][case] = time.perf_counter()
report(topo.rank, out)
