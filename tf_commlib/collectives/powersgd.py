"""PowerSGD (Vogels et al., NeurIPS'19, Alg. 1 and 2): a rank-r approximation of each layer's
summed gradient by one step of subspace iteration per call, warm-started, with error feedback.

The collective sees one flat bucket and the shapes of the tensors it holds, in order (Context.shapes;
the formulas get them as options["shapes"], see interface.py). Each tensor of two or more dimensions
is read as a matrix of its leading dimensions x its last one (a Keras kernel [in, out] as it is, a
conv kernel [kh, kw, in, out] as [kh·kw·in, out]: PyTorch's hook flattens all but the first
dimension of its [out, in, kh, kw], the same matrix transposed). A tensor is compressed when it is
such a matrix, has at least the option min_compression_size entries and its factors are smaller
than it ((rows + cols)·rank < rows·cols); the others (vectors, scalars, small tensors) form the
bucket's uncompressed part, summed exactly by one allreduce (PyTorch's "rank-1 tensors"). Without
shapes (None: a direct call on a flat buffer) the bucket is one vector of d, so it is summed exactly:
a flat buffer has no layers to approximate (pass shapes=[(rows, cols)] to compress it as a matrix).

Per call, on each rank w and each compressed tensor t: M_w = x_w + residual_w; P = Σ_w M_w Q (one
allreduce of all the P's of the bucket, concatenated); P̂ = P with orthonormal columns (modified
Gram-Schmidt per tensor, on the same bits on every rank); Q_w = M_wᵀ P̂; Q = Σ_w Q_w (one allreduce
of all the Q's); result P̂ Qᵀ (≈ Σ_w M_w, the same bits on every rank); residual_w = M_w - P̂ Q_wᵀ (the
part of M_w outside span P̂, Alg. 2's local error; result + Σ residuals = Σ M_w). Each tensor's Q is
kept for the next call (warm start); where it is all zero (first call, reset, flush) it is drawn from
a normal generator seeded by the aggregator's seed (or the bucket index) and the tensor's index in
the bucket, equal on every rank. The allreduces are 2dtar on m > 1 nodes of n > 1 ranks, else
dense. The state variable (the aggregator's residual) holds [residual (d) | Q of each compressed
tensor (cols·rank each, in order)]; the residual of the uncompressed part is zero.
"""
import collections
import math

import tensorflow as tf

from tf_commlib import alphabeta
from tf_commlib import link_bytes
from tf_commlib.collectives import dense, two_d_tar
from tf_commlib.collectives.interface import Collective, check_shapes

OPTIONS = {"rank": 4, "min_compression_size": 1024}

# one tensor of a bucket: its offset and size in the flat bucket, its matrix (rows x cols: leading
# dimensions x last one; 0 x 0 for a vector or scalar) and whether it is compressed
Tensor = collections.namedtuple("Tensor", "index offset size rows cols compressed")


def matrix_shape(shape):
    """(rows, cols) of a tensor of this shape read as a matrix, or None for a vector or scalar."""
    if len(shape) < 2:
        return None
    return math.prod(shape[:-1]), shape[-1]


def layout(d, options):
    """The bucket's tensors (a list of Tensor) from options["shapes"] (absent or None: one vector)."""
    shapes = check_shapes(options.get("shapes"), d)
    tensors, offset = [], 0
    for i, shape in enumerate(shapes or [(d,)]):
        size, mat = math.prod(shape), matrix_shape(shape)
        rows, cols = mat or (0, 0)
        squeeze = mat is not None and size >= options["min_compression_size"] and \
            (rows + cols) * options["rank"] < size
        tensors.append(Tensor(i, offset, size, rows, cols, squeeze))
        offset += size
    return tensors


def _sizes(tensors, rank):
    """(entries of the uncompressed part, of all P's, of all Q's, of the compressed matrices)."""
    packed = [t for t in tensors if t.compressed]
    return (sum(t.size for t in tensors if not t.compressed), sum(t.rows for t in packed) * rank,
            sum(t.cols for t in packed) * rank, sum(t.size for t in packed))


def _options(options):
    return COLLECTIVE.resolve_options(None) if options is None else options


def state_size(d, topo, options=None):
    options = _options(options)
    return d + _sizes(layout(d, options), options["rank"])[2]


def residual_to_input(residual, d, topo):
    return residual[:d]


def input_to_residual(x, d, topo, residual):
    """x as the residual, with the loaded state's Q: the commit's, alike on every rank (an all-reduce
    made it), or zero on every rank, which starts it again from initial_q."""
    return tf.concat([x, tf.cast(residual[d:], x.dtype)], 0)


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


def initial_q(cols, rank, seed, tensor=0):
    """The starting Q of the bucket's tensor number `tensor`: standard normal from a stateless
    generator (the same on every rank)."""
    return tf.random.stateless_normal([cols, rank], tf.stack([tf.cast(seed, tf.int64),
                                                             tf.constant(29 + 1000 * tensor, tf.int64)]))


def _concat(parts):
    return tf.concat([tf.reshape(p, [-1]) for p in parts], 0)


def _split(flat, tensors, dim, rank):
    """flat (the concatenated [dim, rank] factors of tensors) -> one [dim, rank] per tensor."""
    sizes = [getattr(t, dim) for t in tensors]
    return [tf.reshape(part, [s, rank]) for part, s in zip(tf.split(flat, [s * rank for s in sizes]), sizes)]


def powersgd(x, topo, density, select, residual=None, ctx=None):
    """(≈ the sum over all ranks of x + residual, per tensor, new state, no indices); density and
    select are not used (the rank option sets the compression)."""
    ctx = ctx or COLLECTIVE.context()
    d = x.shape[0]
    options = {**ctx.options, "shapes": ctx.shapes}
    tensors = layout(d, options)
    state = tf.zeros([state_size(d, topo, options)], x.dtype) if residual is None else residual
    m = x + state[:d]
    packed = [t for t in tensors if t.compressed]
    if not packed:
        return allreduce(m, topo), tf.zeros_like(state), tf.zeros([0], tf.int32)
    rank = options["rank"]
    seed = ctx.bucket if ctx.seed is None else ctx.seed
    pieces = tf.split(m, [t.size for t in tensors])
    matrices, qs, q_offset = [], [], d
    for t in packed:
        matrices.append(tf.reshape(tf.cast(pieces[t.index], tf.float32), [t.rows, t.cols]))
        q = tf.reshape(tf.cast(state[q_offset:q_offset + t.cols * rank], tf.float32), [t.cols, rank])
        qs.append(tf.where(tf.reduce_any(tf.not_equal(q, 0)), q, initial_q(t.cols, rank, seed, t.index)))
        q_offset += t.cols * rank
    ps = _split(allreduce(_concat([mat @ q for mat, q in zip(matrices, qs)]), topo), packed, "rows", rank)
    ps = [orthogonalise(p) for p in ps]
    q_mine = [tf.matmul(mat, p, transpose_a=True) for mat, p in zip(matrices, ps)]
    qs = _split(allreduce(_concat(q_mine), topo), packed, "cols", rank)
    result, left = list(pieces), [tf.zeros_like(piece) for piece in pieces]
    plain = [t for t in tensors if not t.compressed]
    if plain:
        summed = tf.split(allreduce(tf.concat([pieces[t.index] for t in plain], 0), topo),
                          [t.size for t in plain])
        for t, part in zip(plain, summed):
            result[t.index] = part
    for t, mat, p, q, mine in zip(packed, matrices, ps, qs, q_mine):
        result[t.index] = tf.cast(tf.reshape(tf.matmul(p, q, transpose_b=True), [-1]), x.dtype)
        left[t.index] = pieces[t.index] - tf.cast(tf.reshape(tf.matmul(p, mine, transpose_b=True), [-1]), x.dtype)
    return (tf.concat(result, 0), tf.concat(left + [tf.cast(_concat(qs), x.dtype)], 0),
            tf.zeros([0], tf.int32))


def _sum_time(k, m, n, params):
    coll = two_d_tar.COLLECTIVE if _hierarchical(m, n) else dense.COLLECTIVE
    return sum(coll.breakdown(k, m, n, 1.0, params).values()) if k else 0.0


def product_cost(entries, rank, params):
    """A product of a matrix (`entries` entries) with a rank-column factor, or the matrix such a
    product makes: rank multiply-adds per entry, counted as rank passes of one element write each
    (small ranks are memory-bound; not calibrated)."""
    return rank * alphabeta.copy_cost(entries, params)


def time(d, m, n, density, params, options):
    """Dense or 2dtar of d when no tensor is compressed; else the allreduce of the uncompressed part
    (if any) and of all P's and all Q's, four products with each compressed matrix (P, Q, the
    result, the residual), Gram-Schmidt and the error feedback (addition, split, subtraction,
    concatenation)."""
    rank = options["rank"]
    plain, p_size, q_size, entries = _sizes(layout(d, options), rank)
    if not entries:
        return {"allreduce": _sum_time(d, m, n, params), "residual": alphabeta.copy_cost(d, params)}
    return {
        "allreduce_dense": _sum_time(plain, m, n, params),
        "allreduce_p": _sum_time(p_size, m, n, params),
        "allreduce_q": _sum_time(q_size, m, n, params),
        "products": 4 * product_cost(entries, rank, params),
        "orthogonalise": rank * alphabeta.copy_cost(p_size, params),
        "residual": 3 * alphabeta.copy_cost(d, params),
    }


def sent_bytes(d, m, n, density, options):
    """The uncompressed part's allreduce (if any), then those of all P's and of all Q's."""
    coll = two_d_tar.COLLECTIVE if _hierarchical(m, n) else dense.COLLECTIVE
    plain, p_size, q_size, entries = _sizes(layout(d, options), options["rank"])
    if not entries:
        return coll.sent_bytes(d, m, n, 1.0)
    return link_bytes.add(*[coll.sent_bytes(k, m, n, 1.0) for k in (plain, p_size, q_size) if k])


def check_options(options):
    for name in OPTIONS:
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"algorithm_options['powersgd'][{name!r}] must be an int >= 1, got {value!r}")


REFERENCE = None   # a low-rank approximation, not a top-k: tests/test_powersgd.py checks it

COLLECTIVE = Collective("powersgd", powersgd, time, sent_bytes, lossy=True, state_size=state_size,
                        residual_to_input=residual_to_input, input_to_residual=input_to_residual, options=OPTIONS, check_options=check_options,
                        auto_candidate=True)
