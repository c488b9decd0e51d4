"""Adaptive density (tyagi §3-D, adaptive compression ratio) for DistributedOptimizer(density="adaptive").

Every candidate density is profiled for a few steps from an in-memory snapshot of the model's and
the optimizer's variables (weights, optimizer state, DGC momentum, residuals, steps), which is
restored bit for bit afterwards. Per candidate: the compression gain E‖g_c‖²/E‖g_e‖² (summed over
the profiling steps and all ranks: what left the error-fed gradient g_e over g_e) and the
per-step compression compute (t_compute) and synchronisation (t_sync) times that the collectives'
formulas predict for the model's buckets with the given link parameters. NSGA-II (pymoo, tyagi's
settings: 40 individuals, 10 offspring, SBX(0.9, 15), PM(20), 40 generations, seed 1) minimises
(t_compute, t_sync, 1/gain) over log10(density) between the smallest and the largest candidate,
each objective interpolated linearly in log10(density) between the measured candidates (tyagi
fits curves instead); the chosen density is the knee of the front: the point nearest the ideal
after normalising each objective to [0, 1] over the front. The AdaptiveDensity callback profiles at
the first epoch after warm-up and again when the gain of an epoch moves >= `tolerance` from the
first epoch after the last choice, or when its ``link_params`` change.
"""
import math
import time

import keras
import numpy as np
import tensorflow as tf

from tf_commlib import primitives
from tf_commlib.alphabeta import LinkParams
from tf_commlib.collectives import ALGORITHMS
from tf_commlib.keras.optimizer import distributed_optimizer
from tf_commlib.topology import topology as current_topology

COMPUTE = ("select", "scatter_add", "residual")   # the rest of a collective's breakdown is t_sync


def knee_density(densities, t_compute, t_sync, gains, seed=1):
    """NSGA-II over log10(density) on (t_compute, t_sync, 1/gain) interpolated between the
    profiled densities; returns the density at the knee of the Pareto front."""
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.problem import Problem
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.sampling.rnd import FloatRandomSampling
    from pymoo.optimize import minimize

    order = np.argsort(densities)
    logd = np.log10(np.asarray(densities, np.float64)[order])
    objectives = np.stack([np.asarray(t_compute, np.float64), np.asarray(t_sync, np.float64),
                           1.0 / np.maximum(np.asarray(gains, np.float64), 1e-300)], 1)[order]
    if len(set(densities)) == 1:
        return float(densities[0])

    class Interpolated(Problem):
        def __init__(self):
            super().__init__(n_var=1, n_obj=3, xl=logd[0], xu=logd[-1])

        def _evaluate(self, x, out, *args, **kwargs):
            out["F"] = np.stack([np.interp(x[:, 0], logd, objectives[:, j]) for j in range(3)], 1)

    algorithm = NSGA2(pop_size=40, n_offsprings=10, sampling=FloatRandomSampling(),
                      crossover=SBX(prob=0.9, eta=15), mutation=PM(eta=20), eliminate_duplicates=True)
    res = minimize(Interpolated(), algorithm, ("n_gen", 40), seed=seed, verbose=False)
    front, xs = np.atleast_2d(res.F), np.atleast_2d(res.X)[:, 0]
    low, high = front.min(0), front.max(0)
    normalised = (front - low) / np.where(high > low, high - low, 1.0)
    best = np.lexsort((xs, np.linalg.norm(normalised, axis=1)))[0]   # ties to the sparser
    return float(10 ** xs[best])


def predicted_times(opt, density, params):
    """(t_compute, t_sync) seconds per step of opt's sparse aggregators at this density."""
    topo, compute, sync = current_topology(), 0.0, 0.0
    for agg in opt.lossy_aggregators():
        algorithm = agg.candidates[int(agg.active.numpy())]
        for bucket in agg.buckets:
            d = sum(bucket.sizes)
            name = agg.chooser.resolve(algorithm, d, bucket.shapes)
            parts = ALGORITHMS[name].breakdown(d, topo.m, topo.n, density, params, agg.algorithm_options.get(name),
                                               bucket.shapes)
            compute += sum(v for k, v in parts.items() if k in COMPUTE)
            sync += sum(v for k, v in parts.items() if k not in COMPUTE)
    return compute, sync


def gain_sums(opt):
    """[Σ‖g_c‖², Σ‖g_e‖²] accumulated so far by opt's sparse aggregators, summed over all ranks."""
    local = tf.add_n([tf.convert_to_tensor(agg.gain) for agg in opt.lossy_aggregators()])
    return primitives.allreduce(local, current_topology().world).numpy()


def gain_between(before, after):
    delta = after - before
    return float(delta[0] / delta[1]) if delta[1] > 0 else 1.0


def reprofile_reason(profiled_link, link, baseline, gain, tolerance):
    """Why to profile now: "first" (never profiled), "link" (the link parameters changed), "gain"
    (the last epoch's gain moved >= tolerance from the baseline, the first epoch after the last
    choice), or None."""
    if profiled_link is None:
        return "first"
    if link != profiled_link:
        return "link"
    if baseline is not None and gain is not None and abs(gain - baseline) >= tolerance * baseline * (1 - 1e-9):
        return "gain"
    return None


class DensityProfiler:
    """Runs `steps` training steps of `model` on `batches` ((x, y) pairs, the same count on every
    rank) per candidate density from a snapshot that it restores exactly afterwards."""

    def __init__(self, model, batches, steps=3):
        if steps < 1:
            raise ValueError(f"profile steps must be >= 1, got {steps!r}")
        self.model, self.batches, self.steps = model, list(batches), int(steps)
        if not self.batches:
            raise ValueError("DensityProfiler needs at least one (x, y) batch")

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = self.model.compute_loss(x=x, y=y, y_pred=self.model(x, training=True))
                loss = self.model.optimizer.scale_loss(loss)   # a LossScaleOptimizer's scale (else as is)
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.model.optimizer.apply(grads, self.model.trainable_variables)

        self.step = step

    def state(self):
        seen, out = set(), []
        metrics = [v for m in self.model.metrics for v in m.variables]
        for v in list(self.model.variables) + metrics + list(self.model.optimizer.variables):
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out

    def profile(self, densities, params):
        """Rows {density, gain, t_compute, t_sync, t_step} (t_step: measured median seconds); the
        state, the density included, is as before afterwards."""
        opt = distributed_optimizer(self.model)
        variables = self.state()
        snapshot = [v.numpy() for v in variables]
        rows = []
        try:
            for density in densities:
                for agg in opt.lossy_aggregators():
                    agg.set_density(density)
                before, times = gain_sums(opt), []
                for i in range(self.steps):
                    x, y = self.batches[i % len(self.batches)]
                    start = time.perf_counter()
                    self.step(x, y)
                    times.append(time.perf_counter() - start)
                t_compute, t_sync = predicted_times(opt, density, params)
                rows.append({"density": density, "gain": gain_between(before, gain_sums(opt)),
                             "t_compute": t_compute, "t_sync": t_sync, "t_step": float(np.median(times))})
                for v, value in zip(variables, snapshot):
                    v.assign(value)
        finally:
            for v, value in zip(variables, snapshot):
                v.assign(value)
        return rows


class AdaptiveDensity(keras.callbacks.Callback):
    """Chooses DistributedOptimizer(density="adaptive")'s density at epoch boundaries (put it after
    CompressionScheduler). `batches`: a few (x, y) batches of this rank's training data for the
    profiling; `link_params`: alphabeta.LinkParams (costmodel.calibrate measures them) for t_compute
    and t_sync (set it anew after a recalibration: a change re-profiles). ``history``: one row per
    epoch, rank 0 prints it."""

    def __init__(self, batches, profile_steps=3, tolerance=0.1, link_params=None, verbose=True):
        super().__init__()
        if not tolerance > 0:
            raise ValueError(f"tolerance must be positive, got {tolerance!r}")
        self.batches, self.profile_steps, self.tolerance = batches, profile_steps, tolerance
        self.link_params, self.verbose = link_params or LinkParams(), verbose
        self.profiler, self.profiled_link, self.baseline, self.history = None, None, None, []

    def on_epoch_begin(self, epoch, logs=None):
        opt, outer = distributed_optimizer(self.model), self.model.optimizer
        if not getattr(opt, "adaptive", False):
            raise ValueError("AdaptiveDensity needs DistributedOptimizer(density='adaptive')")
        restored = opt.plan.take_restored()   # from tf_commlib.keras.BackupAndRestore
        if restored:
            self.set_state(restored)
            opt.plan.keep_adaptive_state(self.get_state())
        if epoch < opt.dgc.warmup:
            return
        if not outer.built:   # model.fit builds it at the first step; the profiling needs it now
            with keras.name_scope(outer.name, caller=outer):
                outer.build(self.model.trainable_variables)
            outer.built = True
        gain = self.epoch_gain()
        reason = reprofile_reason(self.profiled_link, self.link_params, self.baseline, gain, self.tolerance)
        if reason is None and self.baseline is None:
            self.baseline = gain
        rows = self.choose() if reason else None
        self.history.append({"epoch": epoch, "density": opt.target_density, "profiled": reason, "gain": gain,
                             "profile": rows})
        opt.set_epoch(epoch)
        if self.verbose and current_topology().rank == 0:
            gain_text = "-" if gain is None else f"{gain:.4f}"
            print(f"[adaptive] epoch {epoch + 1} density {opt.target_density:.4g} (gain {gain_text}"
                  f"{', re-profiled: ' + reason if reason else ''})", flush=True)
        self.last_sums = gain_sums(opt)
        opt.plan.keep_adaptive_state(self.get_state())

    def get_state(self):
        """The choice's state as JSON values: the link it was profiled for, the baseline gain and
        the gain sums at the start of the epoch (the chosen density is the optimizer's)."""
        return {"profiled_link": None if self.profiled_link is None else self.profiled_link.as_list(),
                "baseline": self.baseline,
                "last_sums": None if getattr(self, "last_sums", None) is None else np.asarray(self.last_sums).tolist()}

    def set_state(self, state):
        link = state.get("profiled_link")
        self.profiled_link = None if link is None else LinkParams.from_list(link)
        self.baseline = state.get("baseline")
        self.last_sums = None if state.get("last_sums") is None else np.asarray(state["last_sums"], np.float64)

    def epoch_gain(self):
        """The gain over the last epoch (None before the first profiled epoch)."""
        if getattr(self, "last_sums", None) is None:
            return None
        return gain_between(self.last_sums, gain_sums(distributed_optimizer(self.model)))

    def choose(self):
        opt = distributed_optimizer(self.model)
        if self.profiler is None:
            self.profiler = DensityProfiler(self.model, self.batches, self.profile_steps)
        rows = self.profiler.profile(opt.candidates, self.link_params)
        density = knee_density([r["density"] for r in rows], [r["t_compute"] for r in rows],
                               [r["t_sync"] for r in rows], [r["gain"] for r in rows])
        # every rank computed the same from all-reduced gains; rank 0's choice settles float noise
        world = current_topology().world
        density = float(primitives.broadcast(tf.constant([density], tf.float64), 0, world).numpy()[0])
        opt.set_target_density(min(1.0, max(density, min(opt.candidates))))
        self.profiled_link, self.baseline, self.last_sums = self.link_params, None, None
        return rows


def profile_batches(x, y, batch_size, count=2):
    """The first `count` batches of (x, y) as tensors, for AdaptiveDensity."""
    count = max(1, min(count, math.ceil(len(y) / batch_size)))
    return [(tf.constant(x[i * batch_size:(i + 1) * batch_size]), tf.constant(y[i * batch_size:(i + 1) * batch_size]))
            for i in range(count)]
