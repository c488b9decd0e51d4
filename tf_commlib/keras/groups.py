"""The groups of a DistributedOptimizer's variables: each aggregated by its own GradientAggregator."""
from typing import NamedTuple

from tf_commlib.aggregator import GradientAggregator


class Group(NamedTuple):
    """``aggregator`` aggregates the gradients of the variables at ``indices`` (into the optimizer's
    variable list); ``lossy``: a group of lossy (sparse) collectives, which the epoch policy, the
    adaptive density and momentum masking act on (False: the dense-layer group)."""
    aggregator: GradientAggregator
    indices: list
    lossy: bool
