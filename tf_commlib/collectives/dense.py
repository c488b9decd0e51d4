"""Dense: Horovod allreduce over all ranks (the Dense-SGD / TreeAR baseline)."""
from tf_commlib import costmodel as C
from tf_commlib import link_bytes as L
from tf_commlib import primitives as P
from tf_commlib.collectives.interface import Collective


def dense(x, topo, ctx=None):
    """Sum over all ranks of the flat tensor x."""
    return P.allreduce(x, topo.world)


def time(d, m, n, density, params, options):
    """Ring over all P ranks, 2(P-1)·α + 2(P-1)/P·4d·β, on the inter link when m > 1."""
    a, b = C.world_link(m, params)
    return {"allreduce": C.ring_allreduce(C.BYTES * d, m * n, a, b)}


def sent_bytes(d, m, n, density, options):
    return L.per_rank("allreduce", C.BYTES * d, "world", m, n)


COLLECTIVE = Collective("dense", dense, time, sent_bytes)
