"""DistributedOptimizer(algorithm="auto") in model.fit on 4 ranks (2x2): first it trains the
digits for 3 epochs on a link declared slow (so a lossy candidate is predicted fastest at first)
and records each epoch's choice, what the aggregators ran at each step and the measured
efficiencies; then a new model, without link parameters (measured when fit starts and kept in
$TF_COMMLIB_CACHE, with each candidate's aggregation timed on it), where rank 1 chooses otherwise at epoch 1, which must fail on every rank."""
import keras
import numpy as np

import tf_commlib
from tests.workers._report import report
from tf_commlib.aggregator import Auto
from tf_commlib.alphabeta import LinkParams
from tf_commlib.keras import DistributedOptimizer, default_callbacks
from tfc_apps import digits

topo = tf_commlib.init()
(x, y), _ = digits.load(topo.rank, topo.size)
x, y = x[:160], y[:160]


def compiled(auto):
    model = digits.small_cnn(seed=1)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), algorithm="auto", auto=auto)
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    return model, opt


model, opt = compiled(Auto(cost_params=LinkParams(beta_inter=8 / 10e6)))
ran = []


class Probe(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        (agg,) = opt.lossy_aggregators()
        ran.append(agg.candidates[int(agg.active.numpy())])


model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=default_callbacks() + [Probe()])
out = {"log": opt.auto_epochs.tta.log, "ran": ran, "efficiency": opt.auto_epochs.tta.efficiency}

# no link parameters: measured when fit starts, kept in TF_COMMLIB_CACHE; probe=True: these 3 short epochs
# would not pay the candidates' timing with the default probe=None (measure.probe_pays)
model, opt = compiled(Auto(probe=True))
if topo.rank == 1:
    apply_epoch = type(opt)._apply_epoch

    def other_at_epoch_1(self, epoch):
        apply_epoch(self, epoch)
        if epoch == 1:
            (agg,) = self.lossy_aggregators()
            agg.set_algorithm([c for c in agg.candidates if c != self.algorithm_at(epoch)][0])
    opt._apply_epoch = other_at_epoch_1.__get__(opt)
try:
    model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=default_callbacks())
    out["error"] = None
except Exception as e:   # noqa: BLE001 - the message is what the test checks
    out["error"] = f"{type(e).__name__}: {e}"
out["calibrated_beta_inter"] = opt.calibrated_link.beta_inter
out["probed"] = opt.probed
out["probed_warmup"] = {c: sorted([d, s] for d, s in t.items()) for c, t in opt.probed_warmup.items()}
# the measured / predicted ratio hitopk's predictions take at the warm-up's 0.25 and at the target density,
# and what its timings there give
auto, (lossy,) = opt.auto_epochs, [g for g in opt._groups if g.lossy]
out["warm_ratio"] = [auto._scale(lossy, "hitopk", 0.25),
                     auto.probed_warmup["hitopk"][0.25] / auto._predicted(lossy, "hitopk", 0.25),
                     auto._scale(lossy, "hitopk", opt.target_density)]
report(topo.rank, out)
