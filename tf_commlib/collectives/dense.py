"""Dense: Horovod allreduce over all ranks (the Dense-SGD / TreeAR baseline)."""
from tf_commlib import primitives as P


def dense(x, topo):
    """Sum over all ranks of the flat tensor x."""
    return P.allreduce(x, topo.world)
