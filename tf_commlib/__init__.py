"""tf_commlib: communication-efficient data-parallel training on TensorFlow + Horovod.

Implements Shi et al., "Towards Scalable Distributed Training of Deep Learning on Public Cloud
Clusters" (MLSys'21) and the techniques it builds on (DGC, RedSync, SparCML, AR-Topk).
"""
from tf_commlib.topology import Topology, init, topology

__all__ = ["Topology", "init", "topology"]
