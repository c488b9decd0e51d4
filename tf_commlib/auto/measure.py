"""What DistributedOptimizer(algorithm="auto") measures before it decides, once per cluster: the
link's parameters (costmodel.cached_calibration) and each candidate's aggregation of the model's
buckets on it, at the target density and at the DGC warm-up's (probe_candidates), kept in a cache
folder, and the bucket size that follows from them (lossy_bucket_bytes). AutoEpochs
(tf_commlib.keras.auto_epoch) predicts from them.
"""
import os

import numpy as np
import tensorflow as tf

from tf_commlib import costmodel, fusion, replicas
from tf_commlib.alphabeta import LinkParams
from tf_commlib.auto import rounds
from tf_commlib.collectives import ALGORITHMS, bucket_bytes, predict
from tf_commlib.topology import topology as current_topology


def cache_path():
    """Where "auto" keeps the link it measured without Auto(cost_params=...): calibration.json in
    $TF_COMMLIB_CACHE, default ~/.cache/tf_commlib (costmodel.cached_calibration: keyed by layout,
    hosts, TensorFlow and sizes, so measured once per cluster)."""
    root = os.environ.get("TF_COMMLIB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tf_commlib")
    os.makedirs(root, mode=0o700, exist_ok=True)
    return os.path.join(root, "calibration.json")


class Measurements:
    """What "auto" of one DistributedOptimizer measured on the cluster, owned by it
    (``opt.measurements``): ``link`` (the LinkParams measured, None before), ``probed`` ({candidate:
    seconds} of each candidate's aggregation of the model's buckets at the target density, None where
    not timed), ``probed_warmup`` ({candidate: {density: seconds}} at the DGC warm-up's densities) and
    ``local`` (the DiLoCo rounds' (node_s, exchange_s, sync_s), None without them)."""

    def __init__(self):
        self.link, self.probed, self.probed_warmup, self.local = None, None, {}, None

    def calibrate(self, opt, variables):
        """For opt, whose schedule runs "auto": without Auto(cost_params=...), the link parameters
        measured once per cluster at the sizes of these variables' buckets (the cache keeps them:
        cache_path); where the link is measured (or Auto(probe=True)), every candidate timed on it
        (probe). A collective: DistributedOptimizer.measure calls it on every rank before the optimizer
        is built (never build() itself, which Keras runs on one rank's thread for a cloned model)."""
        probe = opt.auto.cost_params is None if opt.auto.probe is None else opt.auto.probe
        measure = opt.auto.cost_params is None and self.link is None
        if not measure and not (probe and self.probed is None):
            return
        topo = current_topology()
        if measure:
            opt.size_buckets(variables)
            largest = fusion.largest_bucket(variables, opt.fusion_threshold_bytes)
            self.link = LinkParams() if topo.size == 1 else costmodel.cached_calibration(
                topo, cache_path(), **costmodel.sizes_for(largest))[0]
        compressible = any(not opt.dense_layers(v) for v in variables)   # else auto has nothing to choose
        if probe and topo.size > 1 and self.probed is None and not opt.selection.qrgc and compressible:
            link = opt.auto.cost_params or self.link or LinkParams()
            # Auto(probe=None): priced against the fit's steps where they are known
            steps = opt.fit_epochs * opt.fit_steps if opt.auto.probe is None and opt.fit_epochs and \
                opt.fit_steps else None
            probed, warm = probe_candidates(opt, variables, link, steps=steps)
            cap = None if probed is None else lossy_bucket_bytes(opt, probed)
            if cap is not None:   # the run's buckets are that candidate's: timed again where they differ
                specs = [tf.TensorSpec(v.shape, v.dtype) for v in variables if not opt.dense_layers(v)]
                before = [b.sizes for b in fusion.plan(specs, opt.fusion_threshold_bytes)]
                opt.use_bucket_cap(cap, variables)
                if [b.sizes for b in fusion.plan(specs, opt.fusion_threshold_bytes)] != before:
                    probed, warm = probe_candidates(opt, variables, link)
            if probed is not None:
                self.probed, self.probed_warmup = probed, warm
                self.local = probe_local(opt, variables, link)

    def probe(self, opt, variables, link):
        """Every candidate (and the DiLoCo rounds) timed again on ``link`` (a link measured again during
        the run), from the cache where timed there before. A collective."""
        self.probed, self.probed_warmup = probe_candidates(opt, variables, link)
        self.local = probe_local(opt, variables, link)


def calibrate_link(opt, variables):
    """opt.measurements.calibrate(opt, variables) for a DistributedOptimizer whose schedule runs "auto"
    (nothing otherwise). A collective."""
    if "auto" in opt.schedule.values():
        opt.measurements.calibrate(opt, variables)


def lossy_bucket_bytes(opt, probed):
    """The bucket size "auto" runs with where the user gave none: it starts with the exact
    collectives' (1 MB, which overlaps backprop); where a lossy candidate's timed aggregation is at
    most Auto.switch times the fastest exact one's, that candidate's larger size
    (collectives.bucket_bytes: a lossy collective's fixed costs per bucket; the optimizer's
    bucket_cap, fitted to the model by size_buckets), else None. Decided from the timings kept in the
    cache, so a resumed run on the cluster builds the same buckets."""
    if opt.fusion_arg is not None:
        return None
    exact = [t for c, t in probed.items() if not ALGORITHMS[c].lossy]
    lossy = {c: t for c, t in probed.items() if ALGORITHMS[c].lossy}
    if not exact or not lossy:
        return None
    best = min(lossy, key=lossy.get)
    size = bucket_bytes([best])
    return size if lossy[best] <= opt.auto.switch * min(exact) and size > opt.bucket_cap else None


def warmup_densities(opt):
    """The densities other than the target that opt's DGC warm-up runs, largest first."""
    return sorted({opt.density_at(e) for e in range(opt.plan.warmup)} - {opt.target_density}, reverse=True)


def probe_pays(steps, first_s, runs, predicted):
    """Whether timing the candidates earns itself back: the steps left times the most the choice can
    save per step (the slowest candidate's predicted collectives less the fastest's, ``predicted``:
    {candidate: seconds}) above what the probe's other runs cost, each taken at its first run's seconds
    (a trace of the aggregation and its calls). Horovod's Keras benchmark, ResNet-50 at 64 px on 2x2 at
    500 Mbit/s: 12 steps do not pay a probe of about two minutes; 100 do."""
    return steps * (max(predicted.values()) - min(predicted.values())) > (runs - 1) * first_s


def probe_candidates(opt, variables, link, repeats=3, steps=None):
    """({candidate: seconds}, {candidate: {density: seconds}}), or (None, {}) where ``steps`` (the steps
    the fit runs; None: not known, always timed) do not pay the timing (probe_pays, after its first run,
    the same on every rank; nothing cached then): one aggregation of the compressible
    variables' gradients (random normal) with each of opt.auto.candidates, as opt runs it (its
    buckets, target density, selector and options; the exact ones in 16 bits unless compression
    says otherwise), in a tf.function: the median of ``repeats`` calls after one warm-up call,
    averaged over the ranks; the second dict: each lossy candidate whose predicted time depends on
    the density, at each of the DGC warm-up's densities (warmup_densities), which the fit pays for.
    Kept in the cache folder (cache_path) under a key that holds ``link`` (the LinkParams of the
    predictions: calibration_key), so it is measured again when they are. A collective."""
    import json
    import time

    from tf_commlib.aggregator import GradientAggregator
    from tf_commlib.collectives import with_compression
    from tf_commlib.timing import ready

    topo, names = current_topology(), list(opt.auto.candidates)
    lossy = [v for v in variables if not opt.dense_layers(v)]
    compression = "fp16" if opt.compression == "none" else opt.compression
    options = with_compression(opt.algorithm_options, compression)
    d = sum(int(np.prod(v.shape)) for v in lossy)
    runs = [(c, opt.target_density) for c in names] + [
        (c, density) for c in names if ALGORITHMS[c].lossy for density in warmup_densities(opt)
        if predict(c, d, topo.m, topo.n, density, link, options.get(c))
        != predict(c, d, topo.m, topo.n, opt.target_density, link, options.get(c))]
    key = costmodel.calibration_key(topo, {
        "probe": names, "shapes": [[list(v.shape), str(v.dtype)] for v in lossy], "density": opt.target_density,
        "selector": opt.selection.selector, "compression": compression, "link": link.as_list(),
        "fusion_threshold_bytes": opt.fusion_threshold_bytes, "warmup": [list(r) for r in runs[len(names):]],
        "options": json.dumps(opt.algorithm_options, sort_keys=True, default=repr),
        "settings": json.dumps({c: [ALGORITHMS[c].density_scale, dict(ALGORITHMS[c].options)] for c in names},
                               sort_keys=True, default=repr)})

    def measure():
        grads = [tf.random.stateless_normal(v.shape, [i, topo.rank], dtype=v.dtype) * 1e-3
                 for i, v in enumerate(lossy)]
        seconds = []
        for candidate, density in runs:
            if len(seconds) == 1 and steps is not None:   # priced once its first run is paid
                first_s = float(replicas.summed(np.array([time.perf_counter() - started]))[0]) / topo.size
                predicted = {c: predict(c, d, topo.m, topo.n, opt.target_density, link, options.get(c)) for c in names}
                if not probe_pays(steps, first_s, len(runs), predicted):
                    return []
            started = time.perf_counter()
            agg = GradientAggregator(candidate, density, opt.selection.selector, topology=topo,
                                     fusion_threshold_bytes=opt.fusion_threshold_bytes, seed=opt.selection.seed,
                                     algorithm_options=options)
            step = tf.function(agg.__call__)
            ready(step(grads))
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                ready(step(grads))
                times.append(time.perf_counter() - start)
            seconds.append(float(np.median(times)))
        return (replicas.summed(np.array(seconds, np.float64)) / topo.size).tolist()

    def check(values):
        if len(values) != len(runs):
            raise ValueError(f"a probe must hold {len(runs)} numbers, got {len(values)}")

    values = cached_probe(topo, key, measure, check)
    if not values:
        return None, {}
    warm = {}
    for (candidate, density), seconds in zip(runs[len(names):], values[len(names):]):
        warm.setdefault(candidate, {})[density] = seconds
    return dict(zip(names, values)), warm


def probe_local(opt, variables, link):
    """rounds.probe for the model's variables where "auto" of opt has the candidate "diloco" (else
    None), kept in the cache folder beside probe_candidates' timings (under a key that holds ``link``).
    A collective."""
    topo = current_topology()
    if not rounds.enabled(opt.auto, topo, opt):
        return None
    d = sum(int(np.prod(v.shape)) for v in variables)
    key = costmodel.calibration_key(topo, {"probe": rounds.NAME, "d": d, "codec": rounds.CODEC,
                                           "link": link.as_list(), "codec_traced": True})

    def check(values):
        if len(values) != 3:
            raise ValueError(f"a probe of diloco must hold 3 numbers, got {len(values)}")

    return tuple(cached_probe(topo, key, lambda: rounds.probe(d, topo), check))


def cached_probe(topo, key, measure, check):
    """costmodel.cached_values in the cache folder (cache_path's), in a file named by the key's hash. A
    collective."""
    import hashlib
    import json

    name = "probe-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20] + ".json"
    return costmodel.cached_values(topo, os.path.join(os.path.dirname(cache_path()), name), key, measure, check)[0]
