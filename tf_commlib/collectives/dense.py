"""Dense: Horovod allreduce over all ranks (the Dense-SGD / TreeAR baseline). The option
compression ("none", "fp16", "bf16") sends 16-bit values (wire.py)."""
from tf_commlib import alphabeta
from tf_commlib.collectives import codec
from tf_commlib.collectives import wire
from tf_commlib import link_bytes
from tf_commlib.collectives.interface import Collective, Sharding


def dense(x, topo, ctx=None):
    """Sum over all ranks of the flat tensor x."""
    compression = (ctx or COLLECTIVE.context()).options["compression"]
    summed = wire.allreduce(wire.to_wire(x, topo.size, compression), topo.world)
    return wire.from_wire(summed, x.dtype, topo.size, compression)


def time(d, m, n, density, params, options):
    """Ring over all P ranks, 2(P-1)·α + 2(P-1)/P·4d·β, on the inter link when m > 1 (2 bytes per
    value and the casts with compression; bf16: reduce-scatter + all-gather)."""
    a, b = alphabeta.world_link(m, params)
    compression = codec.get(options.get("compression", "none"))   # formulas reused by other collectives
    steps = {"allreduce": wire.allreduce_time(d, compression, m * n, a, b)}
    if not compression.exact:
        steps["cast"] = wire.cast_cost(d, compression, params)
    return steps


def sent_bytes(d, m, n, density, options):
    return wire.allreduce_bytes(d, options.get("compression", "none"), "world", m, n)


def check_options(options):
    wire.check(options["compression"], "dense")


# sharded (ZeRO-1): a world reduce-scatter (rank r keeps slice r) and a world all-gather
def _reduce_scatter(x, topo, ctx=None):
    compression = (ctx or COLLECTIVE.context()).options["compression"]
    return wire.reduce_scatter_sharded(x, topo, compression, [topo.world])


def _all_gather(piece, topo, name=None):
    return wire.all_gather_sharded(piece, [topo.world], name)


def _sharded_bytes(d, m, n, options):
    p, wire_codec = m * n, codec.get(options.get("compression", "none"))
    dp = wire.padded(d, p)
    return link_bytes.add(link_bytes.per_rank("reducescatter", wire_codec.bytes(dp), "world", m, n),
                 link_bytes.per_rank("allgather", wire_codec.bytes(dp // p), "world", m, n))


SHARDING = Sharding(slot=lambda topo: topo.rank, reduce_scatter=_reduce_scatter, all_gather=_all_gather,
                    bytes=_sharded_bytes)
COLLECTIVE = Collective("dense", dense, time, sent_bytes, options={"compression": "none"},
                        check_options=check_options, sharding=SHARDING, auto_candidate=True)
