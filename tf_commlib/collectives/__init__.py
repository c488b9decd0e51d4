"""Gradient aggregation collectives, one module each, written with tf_commlib.primitives.

Every collective sums a flat tensor of static length d over all ranks and returns the same
result on every rank. Sparse ones take (x, topo, density, select, residual) and return
(aggregated, new residual, sent indices); dense ones take (x, topo). residual_to_input maps a
sparse collective's residual to what this rank adds to its input to hand it to another one.
"""
import collections

from tf_commlib.collectives import dense, hitopk, naive_ag, two_d_tar

Collective = collections.namedtuple("Collective", "fn sparse residual_size residual_to_input")

ALGORITHMS = {
    "dense": Collective(dense.dense, False, None, None),
    "2dtar": Collective(two_d_tar.two_d_tar, False, None, None),
    "naive_ag": Collective(naive_ag.naive_ag, True, naive_ag.residual_size, naive_ag.residual_to_input),
    "hitopk": Collective(hitopk.hitopk, True, hitopk.residual_size, hitopk.residual_to_input),
}
