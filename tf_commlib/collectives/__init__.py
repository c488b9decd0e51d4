"""Gradient aggregation collectives, one module each, written with tf_commlib.primitives.

Every collective sums a flat tensor of static length d over all ranks and returns the same
result on every rank. Sparse ones take (x, topo, density, select, residual) and return
(aggregated, new residual); dense ones take (x, topo).
"""
import collections

from tf_commlib.collectives import dense, hitopk, naive_ag, two_d_tar

Collective = collections.namedtuple("Collective", "fn sparse residual_size")

ALGORITHMS = {
    "dense": Collective(dense.dense, False, None),
    "2dtar": Collective(two_d_tar.two_d_tar, False, None),
    "naive_ag": Collective(naive_ag.naive_ag, True, naive_ag.residual_size),
    "hitopk": Collective(hitopk.hitopk, True, hitopk.residual_size),
}
