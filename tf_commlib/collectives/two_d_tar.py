"""2DTAR: intra-node reduce-scatter -> inter-node allreduce of the shard -> intra-node allgather."""
import tensorflow as tf

from tf_commlib import primitives as P


def two_d_tar(x, topo):
    """Sum over all ranks of the flat tensor x, communicated hierarchically (shi2021 §3.2)."""
    d = tf.shape(x)[0]
    padded = tf.pad(x, [[0, (-d) % topo.n]])
    shard = P.reducescatter(padded, topo.intra)
    shard = P.allreduce(shard, topo.inter)
    return P.allgather(shard, topo.intra)[:d]
