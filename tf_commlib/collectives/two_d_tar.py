"""2DTAR: intra-node reduce-scatter -> inter-node allreduce of the shard -> intra-node allgather.
The option compression ("none", "fp16", "bf16") runs all three in 16 bits (wire.py)."""
import math

import tensorflow as tf

from tf_commlib import alphabeta
from tf_commlib import link_bytes
from tf_commlib import primitives
from tf_commlib.collectives import codec
from tf_commlib.collectives import wire
from tf_commlib.collectives.interface import Collective, Sharding


def two_d_tar(x, topo, ctx=None):
    """Sum over all ranks of the flat tensor x, communicated hierarchically (shi2021 §3.2)."""
    compression = (ctx or COLLECTIVE.context()).options["compression"]
    on_wire = wire.to_wire(x, topo.size, compression)
    d = tf.shape(on_wire)[0]
    padded = tf.pad(on_wire, [[0, (-d) % topo.n]])
    shard = primitives.reducescatter(padded, topo.intra)
    shard = wire.allreduce(shard, topo.inter)
    return wire.from_wire(primitives.allgather(shard, topo.intra)[:d], x.dtype, topo.size, compression)


def time(d, m, n, density, params, options):
    """eq. (7) intra reduce-scatter + ring All-Reduce of the d/n shard over m (the n concurrent
    inter-node rings share each node's link) + intra All-Gather of the shards (eq. (10), dense);
    with compression 2 bytes per value and the casts (bf16's inter All-Reduce: wire.py)."""
    s, compression = math.ceil(d / n), codec.get(options.get("compression", "none"))
    steps = {
        "reducescatter": alphabeta.reducescatter(compression.bytes(n * s), n, params.alpha_intra, params.beta_intra),
        "inter_allreduce": wire.allreduce_time(n * s, compression, m, params.alpha_inter, params.beta_inter),
        "allgather": alphabeta.allgather(compression.bytes(s), n, params.alpha_intra, params.beta_intra),
    }
    if not compression.exact:
        steps["cast"] = wire.cast_cost(d, compression, params)
    return steps


def sent_bytes(d, m, n, density, options):
    s, compression = math.ceil(d / n), codec.get(options.get("compression", "none"))
    return link_bytes.add(link_bytes.per_rank("reducescatter", compression.bytes(n * s), "intra", m, n),
                 wire.allreduce_bytes(s, compression, "inter", m, n),
                 link_bytes.per_rank("allgather", compression.bytes(s), "intra", m, n))


def check_options(options):
    wire.check(options["compression"], "2dtar")


# sharded (ZeRO-1): intra reduce-scatter (local rank l keeps chunk l of d/n), inter reduce-scatter of
# the chunk (node i keeps its sub-chunk i), then the inter and intra all-gathers: rank (i, l) owns
# slice l*m + i, and the bytes are those of 2dtar (its inter allreduce is the inter halves)
def _reduce_scatter(x, topo, ctx=None):
    compression = (ctx or COLLECTIVE.context()).options["compression"]
    return wire.reduce_scatter_sharded(x, topo, compression, [topo.intra, topo.inter])


def _all_gather(piece, topo, name=None):
    return wire.all_gather_sharded(piece, [topo.intra, topo.inter], name)


def _sharded_bytes(d, m, n, options):
    wire_codec = codec.get(options.get("compression", "none"))
    dp = wire.padded(d, m * n)
    return link_bytes.add(link_bytes.per_rank("reducescatter", wire_codec.bytes(dp), "intra", m, n),
                 link_bytes.per_rank("reducescatter", wire_codec.bytes(dp // n), "inter", m, n),
                 link_bytes.per_rank("allgather", wire_codec.bytes(dp // (m * n)), "inter", m, n),
                 link_bytes.per_rank("allgather", wire_codec.bytes(dp // n), "intra", m, n))


SHARDING = Sharding(slot=lambda topo: topo.local * topo.m + topo.node, reduce_scatter=_reduce_scatter,
                    all_gather=_all_gather, bytes=_sharded_bytes)
COLLECTIVE = Collective("2dtar", two_d_tar, time, sent_bytes, options={"compression": "none"},
                        check_options=check_options, sharding=SHARDING, auto_candidate=True)
