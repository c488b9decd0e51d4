"""Plain numpy (float64) LARS (shi2021 eq. (11)) and LAMB (keras.optimizers.Lamb) for the pto tests."""
import numpy as np


def lars(weights, grads_by_step, lr, momentum=0.9, weight_decay_rate=0.0, eeta=0.001,
         nesterov=False, decayed=None, adapted=None):
    """weights: list of arrays; grads_by_step[t][i]: gradient of variable i at step t."""
    ws = [np.asarray(w, np.float64).copy() for w in weights]
    vs = [np.zeros_like(w) for w in ws]
    decayed = decayed or [True] * len(ws)
    adapted = adapted or [True] * len(ws)
    for grads in grads_by_step:
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            d = weight_decay_rate if decayed[i] else 0.0
            wn, gn = np.linalg.norm(ws[i]), np.linalg.norm(g)
            trust = eeta * wn / (gn + d * wn) if adapted[i] and wn > 0 and gn > 0 else 1.0
            u = g + d * ws[i]
            vs[i] = momentum * vs[i] + lr * trust * u
            ws[i] = ws[i] - (momentum * vs[i] + lr * trust * u if nesterov else vs[i])
    return ws


def lamb(weights, grads_by_step, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7, weight_decay=None, decayed=None):
    ws = [np.asarray(w, np.float64).copy() for w in weights]
    decayed = decayed or [True] * len(ws)
    ms = [np.zeros_like(w) for w in ws]
    vs = [np.zeros_like(w) for w in ws]
    for t, grads in enumerate(grads_by_step, start=1):
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            if weight_decay and decayed[i]:
                ws[i] = ws[i] - ws[i] * weight_decay * lr   # Keras's decoupled decay, before the step
            ms[i] = beta_1 * ms[i] + (1 - beta_1) * g
            vs[i] = beta_2 * vs[i] + (1 - beta_2) * g * g
            r = (ms[i] / (1 - beta_1 ** t)) / (np.sqrt(vs[i] / (1 - beta_2 ** t)) + epsilon)
            wn, rn = np.linalg.norm(ws[i]), np.linalg.norm(r)
            ratio = wn / rn if wn > 0 and rn > 0 else 1.0
            ws[i] = ws[i] - ratio * lr * r
    return ws


MAP_SHAPES = [(300,), (17, 3), (5,), (2, 64), (1,), (40, 40), (0,), (3, 3, 4, 8), (129,)]


def map_inputs(seed=0, shapes=MAP_SHAPES):
    """(w, g) pairs, the same on every rank for one seed."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s).astype(np.float32), rng.standard_normal(s).astype(np.float32))
            for s in shapes]


def dgc_lars(grads_by_rank, weights, lr, momentum, weight_decay_rate, eeta):
    """DistributedOptimizer(pto.LARS, algorithm="dense") with momentum correction: every rank
    keeps u <- m u + g, the average of u is aggregated, and LARS takes a plain step with it."""
    p = len(grads_by_rank)
    us = [[np.zeros(np.shape(w)) for w in weights] for _ in range(p)]
    agg = []
    for step in range(len(grads_by_rank[0])):
        for r in range(p):
            us[r] = [momentum * u + np.asarray(g, np.float64) for u, g in zip(us[r], grads_by_rank[r][step])]
        agg.append([np.mean([us[r][i] for r in range(p)], axis=0) for i in range(len(weights))])
    return lars(weights, agg, lr, momentum=0.0, weight_decay_rate=weight_decay_rate, eeta=eeta)


def sgd(weights, grads_by_step, lr, momentum=0.0, nesterov=False):
    """keras.optimizers.SGD: m <- momentum m - lr g; w <- w + m (Nesterov: w + momentum m - lr g)."""
    ws = [np.asarray(w, np.float64).copy() for w in weights]
    ms = [np.zeros_like(w) for w in ws]
    for grads in grads_by_step:
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            ms[i] = momentum * ms[i] - lr * g
            ws[i] = ws[i] + (momentum * ms[i] - lr * g if nesterov else ms[i])
    return ws


def adam(weights, grads_by_step, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7, weight_decay=None, decayed=None):
    """keras.optimizers.Adam / AdamW (Keras's decoupled weight_decay before the step, where decayed)."""
    ws = [np.asarray(w, np.float64).copy() for w in weights]
    ms, vs = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    decayed = decayed or [True] * len(ws)
    for t, grads in enumerate(grads_by_step, start=1):
        alpha = lr * np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            if weight_decay and decayed[i]:
                ws[i] = ws[i] - ws[i] * weight_decay * lr
            ms[i] = beta_1 * ms[i] + (1 - beta_1) * g
            vs[i] = beta_2 * vs[i] + (1 - beta_2) * g * g
            ws[i] = ws[i] - ms[i] * alpha / (np.sqrt(vs[i]) + epsilon)
    return ws


def dgc_average(grads_by_rank, momentum):
    """The per-step update DistributedOptimizer aggregates: with DGC momentum correction (momentum
    > 0) each rank's u <- m u + g, averaged over the ranks; else the average of the gradients.
    grads_by_rank[r][t][i]."""
    p, us = len(grads_by_rank), None
    out = []
    for t in range(len(grads_by_rank[0])):
        gs = [[np.asarray(g, np.float64) for g in grads_by_rank[r][t]] for r in range(p)]
        us = gs if us is None else [[momentum * u + g for u, g in zip(us[r], gs[r])] for r in range(p)]
        out.append([np.mean([us[r][i] for r in range(p)], axis=0) for i in range(len(gs[0]))])
    return out


# the layout of tests/workers/zero_worker.py: variables that straddle the slices at P = 4 (the two
# large ones, not dense layers, form one group of 2256 entries, slices of 564: the first spans
# slices 0-2 (larger than any slice), the second 2-3; the small ones, dense layers, another of 79
# entries padded to 80, slices of 20: (30,) and (32,) straddle two, (3,) is smaller than a slice)
ZERO_SHAPES = [(40, 30), (30,), (3,), (33, 32), (32,), (7, 2)]


def zero_inputs(rank, steps, shapes=ZERO_SHAPES):
    """(initial weights, the same on every rank; rank's gradients per step)."""
    rng = np.random.default_rng(7)
    weights = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    rng = np.random.default_rng(100 + rank)
    return weights, [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(steps)]
