"""Keras 3 integration: DistributedOptimizer, its option groups, DiLoCo, and the callbacks that go with it."""
from tf_commlib.keras.callbacks import (BackupAndRestore, BroadcastGlobalVariables, CompileGuard, CompressionScheduler,
                                        MetricAverage, NodeSync, average_variables, broadcast_variables,
                                        default_callbacks)
from tf_commlib.keras.adaptive import AdaptiveDensity
from tf_commlib.keras.options import DGC, Auto, Schedule, Selection
from tf_commlib.keras.optimizer import DistributedOptimizer, distributed_optimizer
from tf_commlib.keras.diloco import DiLoCo
from tf_commlib.keras.loss_scale import LossScaleOptimizer, global_loss_scale, with_loss_scale

__all__ = ["DistributedOptimizer", "DiLoCo", "DGC", "Schedule", "Auto", "Selection", "LossScaleOptimizer",
           "distributed_optimizer", "global_loss_scale", "with_loss_scale",
           "AdaptiveDensity", "BackupAndRestore", "BroadcastGlobalVariables", "CompileGuard", "CompressionScheduler",
           "MetricAverage", "NodeSync", "average_variables", "broadcast_variables", "default_callbacks"]
