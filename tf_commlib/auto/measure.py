"""What DistributedOptimizer(algorithm="auto") measures before it decides, once per cluster and kept in a
cache folder: the link's parameters (costmodel.cached_calibration), each candidate's aggregation of the
model's buckets timed on it at the target density and the DGC warm-up's (probe_candidates), and the
bucket size that follows (lossy_bucket_bytes). AutoEpochs (tf_commlib.keras.auto_epoch) predicts from them.
"""
import hashlib
import json
import os
import time

import numpy as np
import tensorflow as tf

from tf_commlib import costmodel, fusion, replicas, timing
from tf_commlib.alphabeta import LinkParams
from tf_commlib.auto import rounds
from tf_commlib.collectives import ALGORITHMS, bucket_bytes, predict
from tf_commlib.topology import topology as current_topology


def cache_path(kind, key):
    """The file in $TF_COMMLIB_CACHE (default ~/.cache/tf_commlib) that keeps what ``key`` names, one per
    key: ``kind``-<hash of key>.json. Kinds: "calibration" (the link measured without
    Auto(cost_params=...), a file per layout and sizes that costmodel.cached_calibration checks against
    its whole key, hosts and TensorFlow included), so that every layout an elastic job passes through,
    once measured, is read back, and "probe"."""
    root = os.environ.get("TF_COMMLIB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tf_commlib")
    os.makedirs(root, mode=0o700, exist_ok=True)
    return os.path.join(root, f"{kind}-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
                        + ".json")


class Measurements:
    """What "auto" of one DistributedOptimizer measured, owned by it (``opt.measurements``): ``link``
    (LinkParams, None before), ``probed`` ({candidate: seconds} at the target density, None where not
    timed), ``probed_warmup`` ({candidate: {density: seconds}} at the DGC warm-up's densities) and
    ``local`` (the DiLoCo rounds' (node_s, exchange_s, sync_s), None without them)."""

    def __init__(self):
        self.link, self.probed, self.probed_warmup, self.local = None, None, {}, None

    def calibrate(self, opt, variables):
        """For opt, whose schedule runs "auto": without Auto(cost_params=...), the link measured once per
        cluster at the sizes of these variables' buckets; where the link is measured (or Auto(probe=True)),
        every candidate timed on it. A collective: DistributedOptimizer.measure calls it on every rank
        before the optimizer is built (never in build(), which Keras runs on one rank's thread for a
        cloned model)."""
        probe = opt.auto.cost_params is None if opt.auto.probe is None else opt.auto.probe
        measure = opt.auto.cost_params is None and self.link is None
        if not measure and not (probe and self.probed is None):
            return
        topo = current_topology()
        if measure:
            opt.size_buckets(variables)
            largest = fusion.largest_bucket(variables, opt.fusion_threshold_bytes)
            sizes = costmodel.sizes_for(largest)
            self.link = LinkParams() if topo.size == 1 else costmodel.cached_calibration(   # a file per layout
                topo, cache_path("calibration", {"layout": [topo.m, topo.n], "sizes": sizes}), **sizes)[0]
        compressible = any(not opt.dense_layers(v) for v in variables)   # else auto has nothing to choose
        if not (probe and topo.size > 1 and self.probed is None and not opt.selection.qrgc and compressible):
            return
        link = opt.auto.cost_params or self.link or LinkParams()
        priced = opt.auto.probe is None and opt.fit_epochs and opt.fit_steps   # Auto(probe=None)
        probed, warm = probe_candidates(opt, variables, link, steps=opt.fit_epochs * opt.fit_steps if priced else None)
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
        """Every candidate and the DiLoCo rounds timed again on ``link`` (measured again during the run),
        from the cache where timed there before. A collective."""
        self.probed, self.probed_warmup = probe_candidates(opt, variables, link)
        self.local = probe_local(opt, variables, link)


def calibrate_link(opt, variables):
    """opt.measurements.calibrate(opt, variables) where opt's schedule runs "auto". A collective."""
    if "auto" in opt.schedule.values():
        opt.measurements.calibrate(opt, variables)


def lossy_bucket_bytes(opt, probed):
    """The bucket size "auto" runs with where the user gave none, or None: it starts with the exact
    collectives' (1 MB, which overlaps backprop); where the fastest lossy candidate's timed aggregation
    is at most Auto.switch times the fastest exact one's, that candidate's larger size
    (collectives.bucket_bytes). Decided from the cached timings, so a resumed run builds the same buckets."""
    exact = [t for c, t in probed.items() if not ALGORITHMS[c].lossy]
    lossy = {c: t for c, t in probed.items() if ALGORITHMS[c].lossy}
    if opt.fusion_arg is not None or not exact or not lossy:
        return None
    best = min(lossy, key=lossy.get)
    size = bucket_bytes([best])
    return size if lossy[best] <= opt.auto.switch * min(exact) and size > opt.bucket_cap else None


def warmup_densities(opt):
    """The densities other than the target that opt's DGC warm-up runs, largest first."""
    return sorted({opt.density_at(e) for e in range(opt.plan.warmup)} - {opt.target_density}, reverse=True)


def probe_pays(steps, first_s, runs, predicted):
    """Whether timing the candidates earns itself back: the steps times the most the choice can save per
    step (the slowest candidate's predicted collectives, ``predicted``: {candidate: seconds}, less the
    fastest's) above the probe's other runs at its first run's seconds (a trace and its calls). Horovod's
    Keras benchmark, ResNet-50 at 64 px on 2x2 at 500 Mbit/s: 12 steps do not pay a probe of about two
    minutes; 100 do."""
    return steps * (max(predicted.values()) - min(predicted.values())) > (runs - 1) * first_s


def probe_candidates(opt, variables, link, repeats=3, steps=None):
    """({candidate: seconds}, {candidate: {density: seconds}}): one aggregation of the compressible
    variables' gradients (random normal) with each of opt.auto.candidates as opt runs it (its buckets,
    target density, selector and options; the exact ones in 16 bits unless compression says otherwise),
    in a tf.function, the median of ``repeats`` calls after a warm-up call, averaged over the ranks; then
    each lossy candidate whose predicted time depends on the density at each warm-up density. Kept in the
    cache folder under a key that holds ``link``. (None, {}) where ``steps`` (the fit's; None: always
    timed) do not pay it (probe_pays after its first run; nothing cached). A collective."""
    from tf_commlib.aggregator import GradientAggregator
    from tf_commlib.collectives import with_compression

    topo, names = current_topology(), list(opt.auto.candidates)
    lossy = [v for v in variables if not opt.dense_layers(v)]
    compression = "fp16" if opt.compression == "none" else opt.compression
    options = with_compression(opt.algorithm_options, compression)
    d = sum(int(np.prod(v.shape)) for v in lossy)

    def predicted(c, density):
        return predict(c, d, topo.m, topo.n, density, link, options.get(c))

    runs = [(c, opt.target_density) for c in names] + [
        (c, density) for c in names if ALGORITHMS[c].lossy for density in warmup_densities(opt)
        if predicted(c, density) != predicted(c, opt.target_density)]
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
        seconds, started = [], time.perf_counter()
        for candidate, density in runs:
            if len(seconds) == 1 and steps is not None:   # priced once its first run is paid
                first_s = float(replicas.summed(np.array([time.perf_counter() - started]))[0]) / topo.size
                if not probe_pays(steps, first_s, len(runs), {c: predicted(c, opt.target_density) for c in names}):
                    return []
            started = time.perf_counter()
            step = tf.function(GradientAggregator(
                candidate, density, opt.selection.selector, topology=topo, seed=opt.selection.seed,
                fusion_threshold_bytes=opt.fusion_threshold_bytes, algorithm_options=options).__call__)
            seconds.append(timing.median_time(lambda: timing.ready(step(grads)), repeats))
        return (replicas.summed(np.array(seconds, np.float64)) / topo.size).tolist()

    values = cached_probe(topo, key, measure, len(runs))
    if not values:
        return None, {}
    warm = {}
    for (candidate, density), seconds in zip(runs[len(names):], values[len(names):]):
        warm.setdefault(candidate, {})[density] = seconds
    return dict(zip(names, values)), warm


def probe_local(opt, variables, link):
    """rounds.probe of the model's variables where "auto" of opt has the candidate "diloco" (else None),
    cached beside probe_candidates' timings. A collective."""
    topo = current_topology()
    if not rounds.enabled(opt.auto, topo, opt):
        return None
    d = sum(int(np.prod(v.shape)) for v in variables)
    key = costmodel.calibration_key(topo, {"probe": rounds.NAME, "d": d, "codec": rounds.CODEC,
                                           "link": link.as_list(), "codec_traced": True})
    return tuple(cached_probe(topo, key, lambda: rounds.probe(d, topo), 3))


def cached_probe(topo, key, measure, count):
    """costmodel.cached_values of ``count`` numbers in cache_path("probe", key). A collective."""
    def check(values):
        if len(values) != count:
            raise ValueError(f"a probe must hold {count} numbers, got {len(values)}")

    return costmodel.cached_values(topo, cache_path("probe", key), key, measure, check)[0]
