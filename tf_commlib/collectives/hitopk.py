"""HiTopKComm (shi2021 Alg. 2): intra-node reduce-scatter, top-k of the own shard, allgather of
values and indices among the ranks with the same local index (one per node), scatter-add,
intra-node allgather of the shards."""
import math

import tensorflow as tf

from tf_commlib import primitives as P
from tf_commlib.collectives.count import num_selected
from tf_commlib.ops import scatter_add


def shard_size(d, n):
    return math.ceil(d / n)


def residual_size(d, topo):
    return shard_size(d, topo.n)


def residual_to_input(residual, d, topo):
    """The shard's residual at its place in a length-d input (the node sums it back up)."""
    s = shard_size(d, topo.n)
    return tf.pad(residual, [[topo.local * s, (topo.n - 1 - topo.local) * s]])[:d]


def hitopk(x, topo, density, select, residual=None):
    """Sparse hierarchical sum over all ranks of the flat tensor x (static length d).

    The residual (error feedback) lives on this rank's shard after the reduce-scatter; returns
    (aggregated, new residual, sent), sent being the indices of x that this rank's node sent.
    x is padded to n equal shards; the padding is never selected.
    """
    d, n = x.shape[0], topo.n
    s = shard_size(d, n)
    shard = P.reducescatter(tf.pad(x, [[0, n * s - d]]), topo.intra)
    if residual is not None:
        shard = shard + residual
    real = max(0, min(s, d - topo.local * s))  # entries of this shard that are not padding
    if real > 0:
        values, indices = select(shard[:real], num_selected(density, d / n))
    else:
        values, indices = tf.zeros([0], x.dtype), tf.zeros([0], tf.int32)
    summed = scatter_add(P.allgather(indices, topo.inter), P.allgather(values, topo.inter), s)
    aggregated = P.allgather(summed, topo.intra)[:d]
    sent = P.allgather(indices + tf.cast(topo.local * s, indices.dtype), topo.intra)
    return aggregated, shard - scatter_add(indices, values, s), sent
