"""The epoch-level plan of DistributedOptimizer (DGC warm-up, schedule, adaptive density's target),
RedSync's dense-layer policy, the qRGC group's options and the default bucket size (the adaptive choosing
is keras/adaptive.py)."""
from tf_commlib import fusion
from tf_commlib.collectives import bucket_bytes
from tf_commlib.keras.options import CANDIDATES, WARMUP_DENSITIES  # noqa: F401  (re-exported)

DENSE_SIZE_THRESHOLD = 1024  # entries; RedSync sends small layers dense


def default_dense_layers(variable):
    """RedSync policy: biases and normalisation parameters (1-D) and small tensors go dense."""
    size = 1
    for s in tuple(variable.shape):
        size *= s
    return len(tuple(variable.shape)) <= 1 or size < DENSE_SIZE_THRESHOLD


class EpochPlan:
    """The density and the collective of each epoch: ``schedule`` = {epoch: algorithm} from epoch 0,
    ``dgc`` (tf_commlib.keras.DGC: its warm-up), ``target_density`` after the warm-up, and the
    ``candidates`` of adaptive density (empty: not adaptive)."""

    def __init__(self, schedule, dgc, target_density, candidates=()):
        self.schedule, self.dgc = dict(schedule), dgc
        self.target_density, self.candidates = float(target_density), tuple(candidates)
        self.adaptive_state = None   # AdaptiveDensity's state (JSON values), which BackupAndRestore saves
        self._restored = None        # what a restore read, until AdaptiveDensity takes it up

    def keep_adaptive_state(self, state):
        self.adaptive_state = state

    def restore_adaptive_state(self, state):
        """A backup's AdaptiveDensity state, for take_restored (BackupAndRestore)."""
        self._restored = state

    def take_restored(self):
        """The adaptive state a restore read (once; None without one)."""
        state, self._restored = self._restored, None
        return state

    @property
    def adaptive(self):
        return bool(self.candidates)

    @property
    def warmup(self):
        return self.dgc.warmup

    def density_at(self, epoch):
        return self.dgc.density_at(epoch, self.target_density, self.adaptive)

    def algorithm_at(self, epoch):
        return [a for e, a in self.schedule.items() if e <= epoch][-1]


def qrgc_options(algorithm_options):
    """algorithm_options for the qRGC group: value_codec "mean" added for every registered
    algorithm that takes it and where algorithm_options does not set value_codec."""
    from tf_commlib.collectives import ALGORITHMS

    out = {name: dict(opts) for name, opts in (algorithm_options or {}).items()}
    for name, coll in ALGORITHMS.items():
        if "value_codec" in coll.options and "value_codec" not in out.get(name, {}):
            try:
                coll.resolve_options({**out.get(name, {}), "value_codec": "mean"})
            except ValueError:   # the algorithm refuses "mean" (SparCML's merged streams)
                continue
            out.setdefault(name, {})["value_codec"] = "mean"
    return out


def default_fusion_threshold(algorithms):
    """The bucket size of the compressible variables where fusion_threshold_bytes is None: the largest
    that the collectives `algorithms` (a schedule's names) ask for (tf_commlib.collectives.bucket_bytes);
    "auto" starts with the exact collectives' (tf_commlib.auto.measure.lossy_bucket_bytes may raise it)."""
    named = [a for a in algorithms if a != "auto"]
    return bucket_bytes(named) if named else fusion.DEFAULT_THRESHOLD_BYTES
