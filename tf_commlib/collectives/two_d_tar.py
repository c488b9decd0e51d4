"""2DTAR: intra-node reduce-scatter -> inter-node allreduce of the shard -> intra-node allgather."""
import math

import tensorflow as tf

from tf_commlib import costmodel as C
from tf_commlib import link_bytes as L
from tf_commlib import primitives as P
from tf_commlib.collectives.interface import Collective


def two_d_tar(x, topo, ctx=None):
    """Sum over all ranks of the flat tensor x, communicated hierarchically (shi2021 §3.2)."""
    d = tf.shape(x)[0]
    padded = tf.pad(x, [[0, (-d) % topo.n]])
    shard = P.reducescatter(padded, topo.intra)
    shard = P.allreduce(shard, topo.inter)
    return P.allgather(shard, topo.intra)[:d]


def time(d, m, n, density, params, options):
    """eq. (7) intra reduce-scatter + ring All-Reduce of the d/n shard over m (the n concurrent
    inter-node rings share each node's link) + intra All-Gather of the shards (eq. (10), dense)."""
    s = math.ceil(d / n)
    return {
        "reducescatter": C.reducescatter(C.BYTES * n * s, n, params.alpha_intra, params.beta_intra),
        "inter_allreduce": C.ring_allreduce(C.BYTES * s * n, m, params.alpha_inter, params.beta_inter),
        "allgather": C.allgather(C.BYTES * s, n, params.alpha_intra, params.beta_intra),
    }


def sent_bytes(d, m, n, density, options):
    s = math.ceil(d / n)
    return L.add(L.per_rank("reducescatter", C.BYTES * n * s, "intra", m, n),
                 L.per_rank("allreduce", C.BYTES * s, "inter", m, n),
                 L.per_rank("allgather", C.BYTES * s, "intra", m, n))


COLLECTIVE = Collective("2dtar", two_d_tar, time, sent_bytes)
