"""Dense: Horovod allreduce over all ranks (the Dense-SGD / TreeAR baseline). The option
compression ("none", "fp16", "bf16") sends 16-bit values (wire.py)."""
from tf_commlib import alphabeta as C
from tf_commlib.collectives import codec as K
from tf_commlib.collectives import wire as W
from tf_commlib.collectives.interface import Collective


def dense(x, topo, ctx=None):
    """Sum over all ranks of the flat tensor x."""
    compression = (ctx or COLLECTIVE.context()).options["compression"]
    summed = W.allreduce(W.to_wire(x, topo.size, compression), topo.world)
    return W.from_wire(summed, x.dtype, topo.size, compression)


def time(d, m, n, density, params, options):
    """Ring over all P ranks, 2(P-1)·α + 2(P-1)/P·4d·β, on the inter link when m > 1 (2 bytes per
    value and the casts with compression; bf16: reduce-scatter + all-gather)."""
    a, b = C.world_link(m, params)
    compression = K.get(options.get("compression", "none"))   # formulas reused by other collectives
    steps = {"allreduce": W.allreduce_time(d, compression, m * n, a, b)}
    if not compression.exact:
        steps["cast"] = W.cast_cost(d, compression, params)
    return steps


def sent_bytes(d, m, n, density, options):
    return W.allreduce_bytes(d, options.get("compression", "none"), "world", m, n)


def check_options(options):
    W.check(options["compression"], "dense")


COLLECTIVE = Collective("dense", dense, time, sent_bytes, options={"compression": "none"},
                        check_options=check_options)
