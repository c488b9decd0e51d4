"""PowerSGD (Vogels et al., NeurIPS'19, Alg. 1 and 2): a rank-r approximation of the summed
gradient by one step of subspace iteration per call, warm-started, with error feedback.

A collective sees one flat bucket (the fused gradients) and its formulas (time, bytes, state) are
functions of the bucket's length d, so the bucket is read as one matrix of rows = ceil(sqrt(d)) x
cols = ceil(d / rows) (zero-padded): square, which minimises the factors' (rows + cols)·rank for
d entries. DistributedOptimizer already sends vectors and layers under 1024 entries through its
dense group, so its buckets hold weight matrices. A bucket is compressed when d >= the option
min_compression_size and the factors are smaller than it ((rows + cols)·rank < d); else it is summed
exactly (with the residual, which is then zero unless flushed into it).

Per call, on each rank w: M_w = x_w + residual_w; P = Σ_w M_w Q (allreduce); P̂ = P with
orthonormal columns (modified Gram-Schmidt, on the same bits on every rank); Q_w = M_wᵀ P̂;
Q = Σ_w Q_w (allreduce); result P̂ Qᵀ (≈ Σ_w M_w, the same bits on every rank); residual_w =
M_w - P̂ Q_wᵀ (the part of M_w outside span P̂, Alg. 2's local error; result + Σ residuals = Σ M_w).
Q is kept for the next call (warm start); where it is all zero (first call, reset, flush) it is drawn
from a normal generator seeded by the aggregator's seed (or the bucket index), equal on every rank.
The allreduces are 2dtar on m > 1 nodes of n > 1 ranks, else dense. The state variable (the
aggregator's residual) holds [residual (d) | Q (cols·rank) when compressed].
"""
import math

import tensorflow as tf

from tf_commlib import alphabeta as C
from tf_commlib import link_bytes as L
from tf_commlib.collectives import dense, two_d_tar
from tf_commlib.collectives.interface import Collective

OPTIONS = {"rank": 4, "min_compression_size": 1024}


def shape(d):
    rows = math.isqrt(d - 1) + 1 if d > 0 else 0   # ceil(sqrt(d))
    return rows, -(-d // max(rows, 1))


def compressed(d, options):
    rows, cols = shape(d)
    return d >= options["min_compression_size"] and (rows + cols) * options["rank"] < d


def _options(options):
    return COLLECTIVE.resolve_options(options) if options is None else options


def residual_size(d, topo, options=None):
    options = _options(options)
    return d + (shape(d)[1] * options["rank"] if compressed(d, options) else 0)


def residual_to_input(residual, d, topo):
    return residual[:d]


def _hierarchical(m, n):
    return m > 1 and n > 1


def allreduce(x, topo):
    """Sum over all ranks: 2dtar where there are nodes of several ranks, else dense."""
    return (two_d_tar.two_d_tar if _hierarchical(topo.m, topo.n) else dense.dense)(x, topo)


def orthogonalise(p):
    """Columns made orthonormal in order (modified Gram-Schmidt); a zero column stays zero."""
    cols = []
    for i in range(p.shape[1]):
        col = p[:, i]
        for done in cols:
            col = col - tf.reduce_sum(done * col) * done
        cols.append(tf.math.divide_no_nan(col, tf.norm(col)))
    return tf.stack(cols, axis=1)


def initial_q(cols, rank, seed):
    """The starting Q: standard normal from a stateless generator (the same on every rank)."""
    return tf.random.stateless_normal([cols, rank], tf.stack([tf.cast(seed, tf.int64), 29]))


def powersgd(x, topo, density, select, residual=None, ctx=None):
    """(P̂ Qᵀ ≈ the sum over all ranks of x + residual, new state, no indices); density and select
    are not used (the rank option sets the compression)."""
    ctx = ctx or COLLECTIVE.context()
    options, d = ctx.options, x.shape[0]
    state = tf.zeros([residual_size(d, topo, options)], x.dtype) if residual is None else residual
    m = x + state[:d]
    if not compressed(d, options):
        return allreduce(m, topo), tf.zeros_like(state), tf.zeros([0], tf.int32)
    rank, (rows, cols) = options["rank"], shape(d)
    q = tf.reshape(tf.cast(state[d:], tf.float32), [cols, rank])
    seed = ctx.bucket if ctx.seed is None else ctx.seed
    q = tf.where(tf.reduce_any(tf.not_equal(q, 0)), q, initial_q(cols, rank, seed))
    matrix = tf.reshape(tf.pad(tf.cast(m, tf.float32), [[0, rows * cols - d]]), [rows, cols])
    p = orthogonalise(tf.reshape(allreduce(tf.reshape(matrix @ q, [-1]), topo), [rows, rank]))
    q_mine = tf.matmul(matrix, p, transpose_a=True)
    q = tf.reshape(allreduce(tf.reshape(q_mine, [-1]), topo), [cols, rank])
    result = tf.reshape(tf.matmul(p, q, transpose_b=True), [-1])[:d]
    left = m - tf.cast(tf.reshape(tf.matmul(p, q_mine, transpose_b=True), [-1])[:d], x.dtype)
    return (tf.cast(result, x.dtype), tf.concat([left, tf.cast(tf.reshape(q, [-1]), x.dtype)], 0),
            tf.zeros([0], tf.int32))


def _sum_time(k, m, n, params):
    coll = two_d_tar.COLLECTIVE if _hierarchical(m, n) else dense.COLLECTIVE
    return sum(coll.breakdown(k, m, n, 1.0, params).values())


def product_cost(entries, rank, params):
    """A product of the matrix (`entries` entries) with a rank-column factor, or the matrix such a
    product makes: rank multiply-adds per entry, counted as rank passes of one element write each
    (small ranks are memory-bound; not calibrated)."""
    return rank * C.copy_cost(entries, params)


def time(d, m, n, density, params, options):
    """Dense or 2dtar of d when not compressed; else the two allreduces (rows·rank, cols·rank), four
    products with the matrix (P, Q, the result, the residual), Gram-Schmidt and the error feedback
    (pad, addition, subtraction)."""
    if not compressed(d, options):
        return {"allreduce": _sum_time(d, m, n, params), "residual": C.copy_cost(d, params)}
    rank, (rows, cols) = options["rank"], shape(d)
    return {
        "allreduce_p": _sum_time(rows * rank, m, n, params),
        "allreduce_q": _sum_time(cols * rank, m, n, params),
        "products": 4 * product_cost(rows * cols, rank, params),
        "orthogonalise": rank * C.copy_cost(rows * rank, params),
        "residual": 3 * C.copy_cost(rows * cols, params),
    }


def sent_bytes(d, m, n, density, options):
    coll = two_d_tar.COLLECTIVE if _hierarchical(m, n) else dense.COLLECTIVE
    if not compressed(d, options):
        return coll.sent_bytes(d, m, n, 1.0)
    rank, (rows, cols) = options["rank"], shape(d)
    return L.add(coll.sent_bytes(rows * rank, m, n, 1.0), coll.sent_bytes(cols * rank, m, n, 1.0))


def check_options(options):
    for name in OPTIONS:
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"algorithm_options['powersgd'][{name!r}] must be an int >= 1, got {value!r}")


REFERENCE = None   # a low-rank approximation, not a top-k: tests/test_powersgd.py checks it

COLLECTIVE = Collective("powersgd", powersgd, time, sent_bytes, sparse=True, residual_size=residual_size,
                        residual_to_input=residual_to_input, options=OPTIONS, check_options=check_options)
