"""tf_commlib: communication-efficient data-parallel training on TensorFlow + Horovod.

Implements Shi et al., "Towards Scalable Distributed Training of Deep Learning on Public Cloud
Clusters" (MLSys'21) and the techniques it builds on (DGC, RedSync, SparCML, AR-Topk).
"""
import os

# TensorFlow's CPU allocator hands every large tensor to malloc, which maps fresh pages for each one
# (above 32 MB glibc always does): a pass over ResNet-50's 100 MB of gradients then costs 2-3x its
# memory time in page faults (x / 4 on 25M floats: 89 ms, 31 ms with the BFC allocator, which keeps
# freed memory). Read when TensorFlow allocates its first tensor; set it to false to opt out.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

from tf_commlib.topology import Topology, init, topology  # noqa: E402

__all__ = ["Topology", "init", "topology", "GradientAggregator", "ops", "collectives", "keras"]
_SUBMODULES = {"ops", "collectives", "keras", "alphabeta", "costmodel", "primitives"}


def __getattr__(name):
    # Lazy, so that `import tf_commlib` (and setup.py) need neither TensorFlow nor the op library.
    if name == "GradientAggregator":
        from tf_commlib.aggregator import GradientAggregator
        return GradientAggregator
    if name in _SUBMODULES:   # `import tf_commlib; tf_commlib.ops.mstopk(...)`, as the README shows
        import importlib
        return importlib.import_module(f"tf_commlib.{name}")
    raise AttributeError(f"module 'tf_commlib' has no attribute {name!r}")
