"""The choice behind the algorithm name "auto": ``Auto`` holds its settings; ``AutoChooser`` applies them
to a GradientAggregator's buckets (collectives.choose per bucket, collectives.keep_exact for the step).
DistributedOptimizer(algorithm="auto") chooses among ``Auto.candidates`` per epoch (tf_commlib.auto.decide).
"""
import dataclasses

from tf_commlib.alphabeta import LinkParams
from tf_commlib.collectives import ALGORITHMS, AUTO_MARGIN, check_margin, check_seconds, choose, keep_exact


def check_cost_params(cost_params, name="cost_params"):
    """ValueError unless cost_params is None or a tf_commlib.alphabeta.LinkParams."""
    if cost_params is not None and not isinstance(cost_params, LinkParams):
        raise ValueError(f"{name} must be None or a tf_commlib.alphabeta.LinkParams (e.g. from "
                         f"tf_commlib.costmodel.calibrate), got {cost_params!r}")


@dataclasses.dataclass(frozen=True)
class Auto:
    """How "auto" chooses; checked when made (ValueError naming the field).

    ``cost_params``: the LinkParams "auto" predicts by (e.g. tf_commlib.costmodel.calibrate; None: measured
    on the cluster and cached). ``margin`` in (0, 1]: GradientAggregator's "auto" picks a lossy collective
    for a bucket only where its predicted time is at most margin times the fastest exact one's
    (collectives.choose's lossy_margin). ``compute_s``: seconds of forward+backward per step (e.g.
    tf_commlib.costmodel.compute_seconds): with overlap, where the per-bucket choice does not bring the
    step to margin times the all-exact step, every bucket stays exact (collectives.keep_exact); None:
    that rule is off, and DistributedOptimizer's "auto" measures it in its first epoch. DistributedOptimizer(algorithm="auto") runs one of ``candidates``
    (default default_candidates()) each epoch, by tf_commlib.auto.decide; a candidate whose measured /
    predicted step moves by more than ``drift`` between two of its epochs has the link measured again.
    ``probe``: each candidate's aggregation timed on the link when fit starts (measure.probe_candidates);
    None: where the link is measured, priced against the fit's steps. ``switch``: a lossy candidate's
    larger buckets where its timed aggregation is at most switch times the fastest exact one's
    (measure.lossy_bucket_bytes). ``diloco``: whether "auto" may run an epoch as DiLoCo rounds across
    several nodes (tf_commlib.auto.rounds); None: where ``candidates`` is the default.
    """
    cost_params: LinkParams = None
    margin: float = AUTO_MARGIN
    compute_s: float = None
    candidates: tuple = None
    switch: float = 0.9
    drift: float = 1.5
    probe: bool = None
    diloco: bool = None

    def __post_init__(self):
        check_cost_params(self.cost_params, "Auto.cost_params")
        object.__setattr__(self, "margin", check_margin(self.margin, "Auto.margin"))
        object.__setattr__(self, "compute_s", check_seconds(self.compute_s, "Auto.compute_s"))
        object.__setattr__(self, "switch", check_margin(self.switch, "Auto.switch"))
        drift = self.drift
        if isinstance(drift, bool) or not isinstance(drift, (int, float)) or not 1 < drift < float("inf"):
            raise ValueError(f"Auto.drift must be a finite number > 1, got {drift!r}")
        object.__setattr__(self, "drift", float(drift))
        if self.probe not in (None, True, False):
            raise ValueError(f"Auto.probe must be None, True or False, got {self.probe!r}")
        if self.diloco not in (None, True, False):
            raise ValueError(f"Auto.diloco must be None, True or False, got {self.diloco!r}")
        candidates = default_candidates() if self.candidates is None else self.candidates
        if isinstance(candidates, str) or not all(isinstance(c, str) and c in ALGORITHMS for c in candidates) \
                or not candidates or len(set(candidates)) != len(candidates):
            raise ValueError(f"Auto.candidates must be distinct names of registered collectives "
                             f"({sorted(ALGORITHMS)}), got {self.candidates!r}")
        object.__setattr__(self, "candidates", tuple(candidates))

    def to_config(self):
        return {"cost_params": None if self.cost_params is None else dataclasses.asdict(self.cost_params),
                "margin": self.margin, "compute_s": self.compute_s, "candidates": list(self.candidates),
                "switch": self.switch, "drift": self.drift, "probe": self.probe, "diloco": self.diloco}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if config.get("cost_params") is not None:
            params = dict(config["cost_params"])
            params["compute_curve"] = tuple(tuple(row) for row in params.get("compute_curve", ()))
            config["cost_params"] = LinkParams(**params)
        return cls(**config)


# DistributedOptimizer(algorithm="auto")'s built-in candidates, in the order they are weighed (ties go to
# the earlier one; a checkpoint keeps the running one's index): dense and 2dtar (with fp16 on the wire unless
# compression says otherwise), DGC's hierarchical top-k and PowerSGD (bench tta's strongest)
AUTO_CANDIDATES = ("dense", "2dtar", "hitopk", "powersgd")


def default_candidates():
    """Auto's candidates where it names none: every registered collective with auto_candidate=True,
    AUTO_CANDIDATES' first in their order, then any other in the order it was registered."""
    flagged = [name for name, coll in ALGORITHMS.items() if coll.auto_candidate]
    return tuple(n for n in AUTO_CANDIDATES if n in flagged) + tuple(n for n in flagged if n not in AUTO_CANDIDATES)


class AutoChooser:
    """Resolves a candidate name to the collective a bucket runs: itself, or for "auto" the cost
    model's choice for that bucket. ``plan``: the aggregator's BucketPlan (its buckets once built);
    ``overlap``: whether buckets aggregate beside backprop (Auto.compute_s counts only then)."""

    def __init__(self, settings, topo, density, algorithm_options, plan, overlap):
        self.settings, self.topo, self.density = settings, topo, density
        self.algorithm_options, self.plan, self.overlap = algorithm_options, plan, overlap
        self._exact_only = None   # decided once the buckets are known

    def resolve(self, name, d, shapes=None, step_rule=True):
        """name, or for "auto" the cheapest collective for a bucket of d entries (of these shapes);
        step_rule=False: the per-bucket choice alone (without compute_s's rule)."""
        if name != "auto":
            return name
        exact = ([a for a in ALGORITHMS if not ALGORITHMS[a].lossy]
                 if step_rule and self.exact_only() else None)
        return choose(d, self.topo.m, self.topo.n, self.density, self.settings.cost_params, candidates=exact,
                      options=self.algorithm_options, shapes=shapes, lossy_margin=self.settings.margin)

    def exact_only(self):
        """True where "auto" keeps every bucket exact (collectives.keep_exact with compute_s and
        margin; overlapped only; known once the buckets are)."""
        buckets = self.plan.buckets
        if self.settings.compute_s is None or not self.overlap or buckets is None:
            return False
        if self._exact_only is None:
            self._exact_only = keep_exact([(sum(b.sizes), b.shapes) for b in buckets], self.topo.m,
                                          self.topo.n, self.density, self.settings.compute_s,
                                          self.settings.cost_params, self.algorithm_options, self.settings.margin)
        return self._exact_only

    def bucket_algorithms(self, name):
        """The collective each bucket runs for candidate `name` (for "auto": the cost model's
        choice per bucket), after build."""
        return [self.resolve(name, sum(b.sizes), b.shapes) for b in self.plan.buckets]

    def spelled_out(self, candidates):
        """The candidates with "auto" spelled out per bucket ("auto:dense,hitopk,..."), once the
        buckets are known (None before): what the consistency check compares, so that ranks that
        resolve "auto" differently fail it instead of running different collectives."""
        if self.plan.buckets is None:
            return None
        return [c if c != "auto" else "auto:" + ",".join(self.bucket_algorithms(c)) for c in candidates]
