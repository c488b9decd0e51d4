"""PTO, the parallel tensor operator of shi2021 §4.2, and the layer-wise adaptive optimizers it
speeds up: LARS (eq. (11)) and LAMB, whose per-layer trust ratios are computed in parallel over
the ranks (each rank 1/P of the layers, one all-gather of the scalars)."""
from pto.lamb import LAMB
from pto.lars import LARS
from pto.parallel import parallel_elementwise, parallel_map, partition

__all__ = ["parallel_map", "parallel_elementwise", "partition", "LARS", "LAMB"]
