"""Per-step time breakdown (shi2021 Fig. 1 analogue), from the script's own timers: each phase of a
training step is timed on its own over a few steps at the end of a stage, with fresh copies of the
state it would change (a separate aggregator, a cloned optimizer on copied variables), so that
profiling never alters training. Every rank runs it at the same point (the phases communicate).
The phases that do not see the input (selection, communication, optimizer) take the gradients as
arguments and are traced once, then reused by later stages: the variables' shapes do not change
between stages, only the resolution does."""
import math
import time

import keras
import tensorflow as tf

from tf_commlib import ops, timing
from tf_commlib.aggregator import Auto, GradientAggregator
from tf_commlib.collectives import ALGORITHMS, with_compression
from tf_commlib.keras import DistributedOptimizer, distributed_optimizer


_TRACED = {}   # (id(optimizer), phase, its settings, gradient shapes) -> (optimizer, traced function)


def _timed(fn, reps, *args):
    fn(*args)   # trace / warm up
    t = time.perf_counter()
    for _ in range(reps):
        out = fn(*args)
    tf.nest.map_structure(lambda x: x.numpy() if hasattr(x, "numpy") else x, out)
    return (time.perf_counter() - t) / reps


def measure(model, optimizer, dataset, loss_fn, algorithm, density, selector, topo, reps):
    """Seconds per step of: input, forward+backward, selection, communication, optimizer. The
    model's non-trainable state (BN moving statistics, which a training forward pass updates on
    each rank from its own data) is put back afterwards, so every rank keeps the same model."""
    with timing.model_state_kept(model):
        return _measure(model, optimizer, dataset, loss_fn, algorithm, density, selector, topo, reps)


def _measure(model, optimizer, dataset, loss_fn, algorithm, density, selector, topo, reps):
    out = {}
    it = iter(dataset)
    x, y = next(it)
    t = time.perf_counter()
    n = 0
    for _ in range(reps):
        try:
            next(it)
            n += 1
        except StopIteration:
            break
    out["input"] = (time.perf_counter() - t) / max(n, 1)
    fwd_bwd = timing.forward_backward(model, x, y, loss_fn)
    out["forward_backward"] = _timed(fwd_bwd, reps)
    grads = fwd_bwd()
    shapes = tuple((tuple(g.shape), g.dtype.name) for g in grads)
    dist = distributed_optimizer(optimizer)

    def aggregator():   # as the optimizer's: its options, compression and, for "auto", its choice
        agg = GradientAggregator(algorithm, density if algorithm == "auto" or ALGORITHMS[algorithm].lossy else 1.0,
                                 selector, topology=topo,
                                 algorithm_options=with_compression(dist.algorithm_options, dist.compression),
                                 auto=dist.auto if dist.overlap else Auto(dist.auto.cost_params, dist.auto.margin))
        agg.build([(g.shape, g.dtype) for g in grads])
        return agg, tf.function(lambda gs: agg.aggregate(gs, sent="indices"))

    agg, aggregate = _traced((optimizer, "communication", algorithm, density, selector, shapes), aggregator)
    names = set(agg.bucket_algorithms(algorithm))
    lossy = any(ALGORITHMS[a].lossy for a in names)
    d = sum(int(g.shape.num_elements()) for g in grads)
    out["selection"] = 0.0
    if lossy:
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
        if all(ALGORITHMS[a].fn is ALGORITHMS["hitopk"].fn for a in names):
            flat = flat[:max(1, d // topo.n)]   # hitopk (or a copy at another setting) selects on its d/n shard
        scaled = min(ALGORITHMS[a].scaled(density) for a in names if ALGORITHMS[a].lossy)
        k = max(1, math.ceil(scaled * int(flat.shape[0])))
        select = _traced((optimizer, "selection", selector, k, shapes),
                         lambda: tf.function(lambda f: ops.SELECTORS[selector](f, k)))
        out["selection"] = _timed(select, reps, flat)

    out["communication"] = max(0.0, _timed(aggregate, reps, list(grads)) - out["selection"])

    apply = _traced((optimizer, "optimizer", shapes), lambda: update_copy(optimizer, model.trainable_variables, grads))
    out["optimizer"] = _timed(apply, reps, list(grads))
    return out


def update_copy(optimizer, variables, grads):
    """A tf.function update(gradients) doing what the optimizer's step does after aggregation (the
    DGC momentum u <- m u + g of a DistributedOptimizer with momentum correction, then the wrapped
    optimizer's step) on copies: a clone of the optimizer (its learning rate a constant: a schedule's
    value does not change the time) on copies of the variables, so timing it changes no state."""
    dist = optimizer if isinstance(optimizer, DistributedOptimizer) else None
    inner = dist.inner_optimizer if dist else optimizer
    clone = type(inner).from_config(dict(inner.get_config(), learning_rate=0.01))
    copies = [keras.Variable(v.numpy(), name=v.name) for v in variables]   # names: for exclusions
    velocities = [tf.Variable(tf.zeros_like(g)) for g in grads] if dist and dist.dgc.momentum_correction else []
    clone.build(copies)

    @tf.function
    def update(gs):
        if velocities:
            gs = [tf.convert_to_tensor(u.assign(dist.m * u + g)) for u, g in zip(velocities, gs)]
        clone.apply(gs, copies)
        return copies[0]
    return update


def _traced(key, build):
    """build() once per key, then reused; the optimizer, kept alive with the entry, stands for one
    training run (so its id cannot be taken by another optimizer)."""
    optimizer, key = key[0], (id(key[0]),) + key[1:]
    if key not in _TRACED:
        _TRACED[key] = (optimizer, build())
    return _TRACED[key][1]


def table(stage, phases, step_s):
    total = sum(phases.values())
    lines = [f"step breakdown, stage {stage.resolution}px batch {stage.batch}/rank "
             f"(measured step {step_s * 1e3:.1f} ms, phases timed apart):"]
    for k, v in phases.items():
        lines.append(f"  {k:17s} {v * 1e3:9.2f} ms  {100 * v / max(total, 1e-12):5.1f} %")
    return "\n".join(lines)
