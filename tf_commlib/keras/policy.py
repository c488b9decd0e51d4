"""The epoch-level policies of DistributedOptimizer: DGC warm-up, RedSync dense layers, schedules,
adaptive density's candidates (the choosing is keras/adaptive.py)."""
import tensorflow as tf

from tf_commlib.aggregator import check_config
from tf_commlib.collectives import ALGORITHMS

# DGC §3.2: density during the warm-up epochs (sparsity 75 %, 93.75 %, 98.4375 %, 99.6 %).
WARMUP_DENSITIES = (0.25, 0.0625, 0.015625, 0.004)
DENSE_SIZE_THRESHOLD = 1024  # entries; RedSync sends small layers dense
CANDIDATES = (0.1, 0.033, 0.011, 0.004, 0.001)   # density="adaptive" picks among these by default


def default_dense_layers(variable):
    """RedSync policy: biases and normalisation parameters (1-D) and small tensors go dense."""
    shape = tuple(variable.shape)
    size = 1
    for s in shape:
        size *= s
    return len(shape) <= 1 or size < DENSE_SIZE_THRESHOLD


def parse_schedule(schedule, algorithm, dense_warmup_epochs=0):
    """{epoch: algorithm} with strictly increasing epochs starting at 0; raises ValueError."""
    if schedule is None:
        schedule = {0: algorithm}
    if not isinstance(schedule, dict) or not schedule:
        raise ValueError(f"schedule must be a non-empty dict {{epoch: algorithm}}, got {schedule!r}")
    epochs = list(schedule)
    if any(not isinstance(e, int) or e < 0 for e in epochs):
        raise ValueError(f"schedule epochs must be integers >= 0, got {epochs}")
    if any(b <= a for a, b in zip(epochs, epochs[1:])):
        raise ValueError(f"schedule epochs must be strictly increasing, got {epochs}")
    for a in schedule.values():
        if a not in ALGORITHMS and a != "auto":
            raise ValueError(f"schedule algorithm must be one of {sorted(ALGORITHMS)}, got {a!r}")
    out = dict(schedule)
    if 0 not in out:
        out = {0: algorithm, **out}
    if dense_warmup_epochs:
        if not isinstance(dense_warmup_epochs, int) or dense_warmup_epochs < 0:
            raise ValueError(f"dense_warmup_epochs must be an int >= 0, got {dense_warmup_epochs!r}")
        later = {e: a for e, a in out.items() if e > dense_warmup_epochs}
        first = [a for e, a in out.items() if e <= dense_warmup_epochs][-1]
        out = {0: "2dtar", dense_warmup_epochs: first, **later}
    return out


def check_candidates(density, candidates):
    """The candidate densities (a tuple; empty when density is not "adaptive"); ValueError for an
    empty or bad list, or candidates without density="adaptive"."""
    if density != "adaptive":
        if candidates is not None:
            raise ValueError(f"candidates go with density='adaptive', got density={density!r}")
        return ()
    candidates = CANDIDATES if candidates is None else candidates
    if isinstance(candidates, (str, bytes)) or not hasattr(candidates, "__iter__"):
        raise ValueError(f"candidates must be a sequence of densities, got {candidates!r}")
    candidates = tuple(candidates)
    if not candidates:
        raise ValueError("candidates: give at least one density for density='adaptive'")
    for c in candidates:
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 < c <= 1.0:
            raise ValueError(f"candidates must be densities in (0, 1], got {candidates!r}")
    return tuple(float(c) for c in candidates)


class EpochPolicy:
    """DistributedOptimizer's epoch-driven policy: the density (DGC warm-up, then the target) and
    the collective (the schedule) of each epoch, set on its sparse aggregators. Needs the
    optimizer's schedule, warmup, target_density, adaptive, selector and _groups."""

    def density_at(self, epoch):
        if epoch < self.warmup:   # adaptive: the choice comes after the warm-up, which alone decides
            warm = WARMUP_DENSITIES[min(epoch, len(WARMUP_DENSITIES) - 1)]
            return warm if self.adaptive else max(self.target_density, warm)
        return self.target_density

    def algorithm_at(self, epoch):
        return [a for e, a in self.schedule.items() if e <= epoch][-1]

    def set_target_density(self, density):
        """The density after warm-up (AdaptiveDensity's choice); takes effect without retracing
        (the aggregators' density is a variable that feeds k)."""
        check_config(self.algorithm_at(0), density, self.selector)
        self.target_density = float(density)

    _epoch = 0

    def set_epoch(self, epoch):
        """Sets density and collective for an epoch (called by CompressionScheduler); before the
        optimizer is built (the first step builds it) the epoch is kept and applied by build()."""
        self._epoch = epoch
        if self._groups_built():
            self._apply_epoch(epoch)

    def _groups_built(self):
        return bool(getattr(self, "_groups", None))

    def _apply_epoch(self, epoch):
        # eagerly: build() runs while Keras traces the first train step, where an assign would
        # only be recorded in that graph (and never run)
        with tf.init_scope():
            self._assign_epoch(epoch)

    def _assign_epoch(self, epoch):
        for group in self._groups:
            if group.lossy:
                group.aggregator.set_density(self.density_at(epoch))
                group.aggregator.set_algorithm(self.algorithm_at(epoch))
