"""GradientAggregator, the user entry point of the collectives, and its parts:

* gradient_aggregator: GradientAggregator (a step's buckets through their collectives),
  ExecutionSettings, check_config;
* bucket_plan: BucketPlan, the fusion of the gradients into buckets and the walk over them;
* consistency_guard: ConsistencyGuard, the check that every rank makes the same call;
* chooser: Auto and AutoChooser, the choice behind "auto";
* residuals: ResidualStore, the error-feedback state;
* sharded: ShardedHalves, the halves of a sharded optimizer update.
"""
from tf_commlib.aggregator.chooser import Auto, check_cost_params
from tf_commlib.aggregator.gradient_aggregator import (OPS, SENT, ExecutionSettings, GradientAggregator,
                                                       check_config)

__all__ = ["GradientAggregator", "Auto", "ExecutionSettings", "check_config", "check_cost_params",
           "OPS", "SENT"]
