"""Adaptive density: profiling every candidate from a snapshot restores the state bit for bit.
Run A trains 3 steps, profiles all candidates (2 steps each), trains 3 more; run B trains the same
6 steps without profiling; both at the same density. Reports whether every variable (weights,
optimizer state, DGC momentum, residuals, steps) ended identical, the profile's rows and how often
the step function was traced."""
import sys

import keras
import numpy as np

import tf_commlib
from tests.workers._report import report
from tfc_apps import digits
from tf_commlib.alphabeta import LinkParams
from tf_commlib.keras import Selection, DistributedOptimizer
from tf_commlib.keras.adaptive import DensityProfiler, profile_batches

ALGORITHM = sys.argv[1]
topo = tf_commlib.init()
(x, y), _ = digits.load(topo.rank, topo.size, 0)
batches = profile_batches(x, y, 16, count=3)


def run(profile):
    model = digits.small_cnn(0)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), algorithm=ALGORITHM,
                               density="adaptive", selection=Selection(seed=0))
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    profiler = DensityProfiler(model, batches, steps=2)
    rows, traced = None, None
    for i in range(6):
        if profile and i == 3:
            traced = profiler.step.experimental_get_tracing_count()   # the first call traces twice (variables)
            rows = profiler.profile(opt.candidates, LinkParams())
        profiler.step(*batches[i % len(batches)])
    state = [v.numpy() for v in profiler.state()]
    traces = (traced, profiler.step.experimental_get_tracing_count())
    return state, rows, traces, [float(a.density.numpy()) for a in opt.lossy_aggregators()]


with_profile, rows, traces, densities = run(True)
without, _, _, densities_without = run(False)
report(topo.rank, {"rank": topo.rank, "rows": rows, "traces": traces, "densities": densities,
                   "densities_without": densities_without, "variables": len(without),
                   "identical": [bool(a.dtype == b.dtype and np.array_equal(a, b))
                                 for a, b in zip(with_profile, without)]})
