"""2DTAR: intra-node reduce-scatter -> inter-node allreduce of the shard -> intra-node allgather.
The option compression ("none", "fp16", "bf16") runs all three in 16 bits (wire.py)."""
import math

import tensorflow as tf

from tf_commlib import alphabeta as C
from tf_commlib import link_bytes as L
from tf_commlib import primitives as P
from tf_commlib.collectives import codec as K
from tf_commlib.collectives import wire as W
from tf_commlib.collectives.interface import Collective, Sharding


def two_d_tar(x, topo, ctx=None):
    """Sum over all ranks of the flat tensor x, communicated hierarchically (shi2021 §3.2)."""
    compression = (ctx or COLLECTIVE.context()).options["compression"]
    wire = W.to_wire(x, topo.size, compression)
    d = tf.shape(wire)[0]
    padded = tf.pad(wire, [[0, (-d) % topo.n]])
    shard = P.reducescatter(padded, topo.intra)
    shard = W.allreduce(shard, topo.inter)
    return W.from_wire(P.allgather(shard, topo.intra)[:d], x.dtype, topo.size, compression)


def time(d, m, n, density, params, options):
    """eq. (7) intra reduce-scatter + ring All-Reduce of the d/n shard over m (the n concurrent
    inter-node rings share each node's link) + intra All-Gather of the shards (eq. (10), dense);
    with compression 2 bytes per value and the casts (bf16's inter All-Reduce: wire.py)."""
    s, compression = math.ceil(d / n), K.get(options.get("compression", "none"))
    steps = {
        "reducescatter": C.reducescatter(compression.bytes(n * s), n, params.alpha_intra, params.beta_intra),
        "inter_allreduce": W.allreduce_time(n * s, compression, m, params.alpha_inter, params.beta_inter),
        "allgather": C.allgather(compression.bytes(s), n, params.alpha_intra, params.beta_intra),
    }
    if not compression.exact:
        steps["cast"] = W.cast_cost(d, compression, params)
    return steps


def sent_bytes(d, m, n, density, options):
    s, compression = math.ceil(d / n), K.get(options.get("compression", "none"))
    return L.add(L.per_rank("reducescatter", compression.bytes(n * s), "intra", m, n),
                 W.allreduce_bytes(s, compression, "inter", m, n),
                 L.per_rank("allgather", compression.bytes(s), "intra", m, n))


def check_options(options):
    W.check(options["compression"], "2dtar")


# sharded (ZeRO-1): intra reduce-scatter (local rank l keeps chunk l of d/n), inter reduce-scatter of
# the chunk (node i keeps its sub-chunk i), then the inter and intra all-gathers: rank (i, l) owns
# slice l*m + i, and the bytes are those of 2dtar (its inter allreduce is the inter halves)
def _reduce_scatter(x, topo, ctx=None):
    compression = (ctx or COLLECTIVE.context()).options["compression"]
    return W.reduce_scatter_sharded(x, topo, compression, [topo.intra, topo.inter])


def _all_gather(piece, topo, name=None):
    return W.all_gather_sharded(piece, [topo.intra, topo.inter], name)


def _sharded_bytes(d, m, n, options):
    codec = K.get(options.get("compression", "none"))
    dp = W.padded(d, m * n)
    return L.add(L.per_rank("reducescatter", codec.bytes(dp), "intra", m, n),
                 L.per_rank("reducescatter", codec.bytes(dp // n), "inter", m, n),
                 L.per_rank("allgather", codec.bytes(dp // (m * n)), "inter", m, n),
                 L.per_rank("allgather", codec.bytes(dp // n), "intra", m, n))


SHARDING = Sharding(slot=lambda topo: topo.local * topo.m + topo.node, reduce_scatter=_reduce_scatter,
                    all_gather=_all_gather, bytes=_sharded_bytes)
COLLECTIVE = Collective("2dtar", two_d_tar, time, sent_bytes, options={"compression": "none"},
                        check_options=check_options, sharding=SHARDING)
