"""AR-Topk (tyagi §3-A/B, Alg. 1), shared by star, var, star_hier and var_hier.

Every rank of a set adds its residual and selects the top-k of the result; the set takes one
root's indices: STAR's root is step mod N (round robin), VAR's the rank with the largest
‖top-k values‖² (all-gathered, ties to the lowest rank). The root's indices are broadcast, every
rank gathers its own values there, and one allreduce sums them. The residual keeps everything
else, this rank's own top-k entries at other positions included.

The root is known only at run time, so its indices travel by primitives.broadcast with a tensor
root: a tf.switch_case over one Horovod broadcast per possible root, of the root's length and then
of its indices. Measured with a 4-rank horovodrun script timing the three in tf.function on this
2-core machine while other jobs loaded it (median of 15, ms for 1e3 / 1e5 / 1e6 int32 indices):
masked allreduce (root's indices, zeros elsewhere) 14.8 / 17.2 / 74.5; Horovod allgather, slice
12.3 / 9.8 / 42.4; switch_case over broadcasts 14.4 / 9.8 / 19.9. The time formulas are tyagi's
ART-Ring (eq. 4a, art_ring: a tree broadcast of the indices and a ring All-Reduce of the k values,
after a broadcast of the root's length); his AG (eq. 3) and ART-Tree (eq. 4b) stand beside it
(tyagi_ag, art_tree) for comparison.
"""
import math

import numpy as np
import tensorflow as tf

from tf_commlib import alphabeta
from tf_commlib import link_bytes
from tf_commlib import primitives
from tf_commlib.collectives import hitopk
from tf_commlib.collectives.count import num_selected
from tf_commlib.collectives.error_feedback import unsent
from tf_commlib.collectives.sparse_message import allgather_sparse
from tf_commlib.ops import scatter_add

STAR, VAR = "star", "var"


def star_root(process_set, ctx):
    """Round robin: the set position step mod N (step from the aggregator's Context)."""
    step = 0 if ctx is None else ctx.step
    return tf.math.floormod(tf.cast(step, tf.int64), process_set.size())


def var_root(process_set, values):
    """The set position with the largest ‖values‖² (float64; NaN counts as +inf), ties to the lowest."""
    norm = tf.reduce_sum(tf.square(tf.cast(values, tf.float64)))
    norms = primitives.allgather(tf.reshape(norm, [1]), process_set)
    norms = tf.where(tf.math.is_nan(norms), tf.constant(np.inf, tf.float64), norms)
    return tf.reduce_min(tf.where(tf.equal(norms, tf.reduce_max(norms)))[:, 0])


def ar_topk(x, real, k, select, process_set, variant, ctx):
    """One AR-Topk round over the set on x, selecting among x[:real] (a Python int).

    Returns (summed values, the root's int32 indices into x, new residual of x)."""
    none = tf.zeros([0], tf.int32)

    def own():
        return select(x[:real], k) if real > 0 else (tf.zeros([0], x.dtype), none)

    if variant == STAR:   # only the root's selection is used: the others skip it
        root = star_root(process_set, ctx)
        indices = tf.cond(tf.equal(root, process_set.rank()), lambda: tf.cast(own()[1], tf.int32), lambda: none)
    else:
        values, indices = own()
        root = var_root(process_set, values)
        indices = tf.cast(indices, tf.int32)
    global_root = tf.gather(tf.constant(process_set.ranks, tf.int64), root)
    root_indices = primitives.broadcast(indices, global_root, process_set)
    gathered = tf.gather(x, root_indices)
    return primitives.allreduce(gathered, process_set), root_indices, unsent(x, gathered, root_indices)


def flat(variant):
    """The flat collective fn over all ranks (tyagi's setting)."""
    def fn(x, topo, density, select, residual=None, ctx=None):
        d = x.shape[0]
        if residual is not None:
            x = x + residual
        summed, indices, new_residual = ar_topk(x, d, num_selected(density, d), select, topo.world, variant, ctx)
        return scatter_add(indices, summed, d), new_residual, indices
    fn.__name__ = variant
    return fn


def hierarchical(variant):
    """Intra-node reduce-scatter (hitopk's step 1), AR-Topk over the inter-node set on each
    shard (k = density·d/n, the residual on the shard), sparse intra-node allgather."""
    def fn(x, topo, density, select, residual=None, ctx=None):
        d = x.shape[0]
        shard = hitopk.reduce_shard(x, topo)
        if residual is not None:
            shard = shard + residual
        real = hitopk.real_size(d, topo.n, topo.local)
        summed, indices, new_residual = ar_topk(shard, real, num_selected(density, d / topo.n), select,
                                                topo.inter, variant, ctx)
        offset = topo.local * hitopk.shard_size(d, topo.n)
        values, node_indices = allgather_sparse(summed, indices + offset, topo.intra)
        return scatter_add(node_indices, values, d), new_residual, node_indices
    fn.__name__ = f"{variant}_hier"
    return fn


def tree_broadcast(nbytes, p, alpha, beta):
    """A binomial-tree broadcast: log2(p)·(α + nbytes·β)."""
    return (math.log2(p) if p > 1 else 0.0) * (alpha + nbytes * beta)


# tyagi §3-C, eqs. (3), (4a), (4b), for Mc bytes of selected values (M bytes dense, ratio c) on N
# ranks: the all-gather Top-k it compares against, and AR-Topk with a ring or a tree All-Reduce.
def tyagi_ag(mc, p, alpha, beta):
    """AG = α·log N + 2·Mc·β·(N−1) (values and indices gathered from every rank)."""
    return (math.log2(p) if p > 1 else 0.0) * alpha + 2 * mc * beta * (p - 1)


def art_ring(mc, p, alpha, beta):
    """ART-Ring = α·[2(N−1) + log N] + Mc·β·[2(N−1)/N + log N]: the indices' tree broadcast and a
    ring All-Reduce of the values (what star and var run: Horovod's allreduce is a ring)."""
    return tree_broadcast(mc, p, alpha, beta) + alphabeta.ring_allreduce(mc, p, alpha, beta)


def art_tree(mc, p, alpha, beta):
    """ART-Tree = 3α·log N + 3·Mc·β·log N: the broadcast and a tree reduce + broadcast."""
    return 3 * tree_broadcast(mc, p, alpha, beta)


def _root_choice(variant, p, link):
    """VAR's all-gather of one float64 norm per rank (tyagi: N floats, negligible)."""
    if variant != VAR:
        return {}
    return {"norms": alphabeta.allgather(8, p, *link)}


def flat_time(variant):
    """ART-Ring (tyagi eq. 4a) over all P ranks with Mc = 4·k bytes of indices and of values, on the
    world's slowest link, after one tree broadcast of the root's length (4 bytes); selection on d,
    scatter-add and error feedback."""
    def time(d, m, n, density, params, options):
        k, p, link = num_selected(density, d), m * n, alphabeta.world_link(m, params)
        return {"select": alphabeta.select_cost(d, params), **_root_choice(variant, p, link),
                "length": tree_broadcast(alphabeta.BYTES, p, *link),
                "art_ring": art_ring(alphabeta.BYTES * k, p, *link),
                "scatter_add": alphabeta.scatter_add_cost(k, d, params),
                "residual": alphabeta.residual_cost(k, d, params)}
    return time


def _round_bytes(variant, k, kind, m, n):
    """One AR-Topk round of k indices on a set of `kind`: length, indices, values (+ VAR's norms)."""
    parts = [link_bytes.per_rank("broadcast", alphabeta.BYTES, kind, m, n),
             link_bytes.per_rank("broadcast", alphabeta.BYTES * k, kind, m, n),
             link_bytes.per_rank("allreduce", alphabeta.BYTES * k, kind, m, n)]
    if variant == VAR:
        parts.append(link_bytes.per_rank("allgather", 8, kind, m, n))
    return link_bytes.add(*parts)


def flat_bytes(variant):
    def sent_bytes(d, m, n, density, options):
        return _round_bytes(variant, num_selected(density, d), "world", m, n)
    return sent_bytes


def hier_time(variant):
    """hitopk's step 1 (pad, eq. (7) intra reduce-scatter), selection on d/n, ART-Ring (eq. 4a) over the m nodes on each shard
    (the n concurrent inter-node rounds share each node's link), an intra All-Gather of the k
    aggregated entries (8 bytes each), scatter-add of n·k into d and error feedback on the shard."""
    def time(d, m, n, density, params, options):
        s, k = hitopk.shard_size(d, n), num_selected(density, d / n)
        inter = (params.alpha_inter, params.beta_inter)
        a, b = params.alpha_intra, params.beta_intra
        rs = hitopk.pad_cost(d, n, params) + alphabeta.reducescatter(alphabeta.BYTES * n * s, n, a, b)   # pad, eq. (7)
        return {"reducescatter": rs, "select": alphabeta.select_cost(s, params),
                **_root_choice(variant, m, (inter[0], inter[1] * n)),
                "length": tree_broadcast(alphabeta.BYTES * n, m, *inter),
                "art_ring": art_ring(alphabeta.BYTES * k * n, m, *inter),
                "intra_allgather": alphabeta.allgather(alphabeta.SPARSE_BYTES * k, n, a, b),
                "scatter_add": alphabeta.scatter_add_cost(n * k, d, params),
                "residual": alphabeta.residual_cost(k, s, params)}
    return time


def hier_bytes(variant):
    """Averaged over the shards (short shards select fewer, empty ones none)."""
    def sent_bytes(d, m, n, density, options):
        s, k = hitopk.shard_size(d, n), num_selected(density, d / n)
        total = {link: 0.0 for link in link_bytes.LINKS}
        for local in range(n):
            kj = min(k, hitopk.real_size(d, n, local))
            shard = link_bytes.add(link_bytes.per_rank("reducescatter", alphabeta.BYTES * n * s, "intra", m, n),
                          _round_bytes(variant, kj, "inter", m, n),
                          link_bytes.per_rank("allgather", alphabeta.SPARSE_BYTES * kj, "intra", m, n))
            total = link_bytes.add(total, {link: v / n for link, v in shard.items()})
        return total
    return sent_bytes

