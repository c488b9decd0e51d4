"""A DistributedOptimizer's groups of variables, each aggregated by one GradientAggregator."""
from typing import NamedTuple


class Group(NamedTuple):
    aggregator: object   # the tf_commlib.GradientAggregator of these variables
    indices: list        # positions of its variables in the optimizer's variable list
    lossy: bool          # True: a lossy collective (sparse or low-rank) may run it; False: always exact
