"""The option groups of DistributedOptimizer: each a small frozen object, validated where it is built.

    DistributedOptimizer(opt, algorithm="hitopk", density=0.01,
                         dgc=DGC(warmup=4, momentum_masking=False),
                         schedule=Schedule({0: "hitopk", 13: "2dtar"}),
                         selection=Selection(selector="mstopk", seed=1),
                         auto=Auto(cost_params=params, compute_s=0.2))

``MOVED`` maps each top-level keyword of an option that a group holds to its group and field (the
TypeError for such a keyword names it); ``grouped(flat)`` reads a config with those keywords at the top.
"""
import dataclasses
import math
import numbers

from tf_commlib.aggregator import Auto   # the fourth group: how "auto" chooses

# DGC §3.2: density during the warm-up epochs (sparsity 75 %, 93.75 %, 98.4375 %, 99.6 %).
WARMUP_DENSITIES = (0.25, 0.0625, 0.015625, 0.004)
CANDIDATES = (0.1, 0.033, 0.011, 0.004, 0.001)   # density="adaptive" picks among these by default


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_bool(owner, **values):
    for arg, value in values.items():
        if not isinstance(value, bool):
            raise ValueError(f"{owner}.{arg} must be True or False, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DGC:
    """Deep Gradient Compression's accuracy techniques around a lossy collective.

    momentum_correction: the momentum lives in DistributedOptimizer: each step u <- m*u + g, and u
      (Nesterov: m*u + g) is what gets aggregated with error feedback (DGC eqs. 4 and 6); the wrapped
      optimizer then takes a plain step. momentum: m; None takes the wrapped keras.optimizers.SGD's
      (or pto.LARS's) momentum and nesterov, which DistributedOptimizer then runs as a copy without
      momentum; any other optimizer needs ``momentum``.
    local_clip_norm: each rank clips its gradient's global norm to local_clip_norm / sqrt(N).
    momentum_masking: u is zeroed where v was sent (DGC's momentum factor masking). Off by default:
      measured (docs/benchmarks.md, bench tta, density 0.01, 8 epochs), off ends 2.5-3.3 points
      higher and reaches the target sooner.
    warmup: epochs of DGC warm-up; density over them 0.25, 0.0625, 0.015625, 0.004 (never below the
      target), then the target.
    """
    momentum_correction: bool = True
    momentum: float = None
    nesterov: bool = False
    local_clip_norm: float = None
    momentum_masking: bool = False
    warmup: int = 0

    def __post_init__(self):
        _check_bool("DGC", momentum_correction=self.momentum_correction, nesterov=self.nesterov,
                    momentum_masking=self.momentum_masking)
        m = self.momentum
        if m is not None and (isinstance(m, bool) or not isinstance(m, numbers.Real) or not 0.0 <= m < 1.0):
            raise ValueError(f"DGC.momentum must be None or a number in [0, 1), got {m!r}")
        c = self.local_clip_norm
        if c is not None and (isinstance(c, bool) or not isinstance(c, numbers.Real) or not 0.0 < c < math.inf):
            raise ValueError(f"DGC.local_clip_norm must be None or a positive finite number, got {c!r}")
        if not _is_int(self.warmup) or self.warmup < 0:
            raise ValueError(f"DGC.warmup must be a number of epochs >= 0, got {self.warmup!r}")
        # plain Python numbers (numpy's would not serialise to JSON)
        object.__setattr__(self, "warmup", int(self.warmup))
        for field in ("momentum", "local_clip_norm"):
            if getattr(self, field) is not None:
                object.__setattr__(self, field, float(getattr(self, field)))

    def density_at(self, epoch, target, adaptive=False):
        """The density of an epoch: the warm-up's (never below target unless adaptive, whose choice
        comes after the warm-up), then target."""
        if epoch < self.warmup:
            warm = WARMUP_DENSITIES[min(epoch, len(WARMUP_DENSITIES) - 1)]
            return warm if adaptive else max(target, warm)
        return target


# the DGC warm-up epochs of algorithm="auto" without dgc=: bench tta's best for hitopk (docs/benchmarks.md,
# "DGC momentum masking": no masking with 2 warm-up epochs ended 0.9304 against 0.9025 without warm-up)
AUTO_WARMUP = 2


def default_dgc(schedule):
    """DistributedOptimizer's DGC without dgc=: DGC(), and where {epoch: algorithm} runs "auto", DGC
    warm-up over AUTO_WARMUP epochs (its lossy candidates run as bench tta measured them best)."""
    return DGC(warmup=AUTO_WARMUP) if "auto" in schedule.values() else DGC()


@dataclasses.dataclass(frozen=True)
class Selection:
    """What is sent: the top-k ``selector`` (tf_commlib.ops.SELECTORS), its ``seed`` (None: the
    selectors' and collectives' own), ``dense_layers`` (predicate variable -> True for variables
    aggregated densely; default RedSync's: 1-D variables and those under 1024 entries) and RedSync's
    ``qrgc``: quantized selection (selector "qrgc", one tensor per bucket) for every lossy variable
    except the output layer (the last), which keeps ``selector``; its messages carry one mean per rank
    (value_codec "mean") in every algorithm that takes that codec, unless algorithm_options sets one."""
    selector: str = "mstopk"
    seed: int = None
    dense_layers: object = None
    qrgc: bool = False

    def __post_init__(self):
        from tf_commlib import ops   # the op library's registry of selectors

        if self.selector not in ops.SELECTORS:
            raise ValueError(f"Selection.selector must be one of {sorted(ops.SELECTORS)}, got {self.selector!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"Selection.seed must be None or an int, got {self.seed!r}")
        if self.dense_layers is not None and not callable(self.dense_layers):
            raise ValueError(f"Selection.dense_layers must be None or a predicate variable -> bool, "
                             f"got {self.dense_layers!r}")
        _check_bool("Selection", qrgc=self.qrgc)
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The collective per epoch: ``epochs`` = {epoch: algorithm}, strictly increasing epochs >= 0
    (epoch 0 defaults to DistributedOptimizer's ``algorithm``), e.g. {0: "hitopk", 13: "2dtar"}
    (shi2021's DAWNBench recipe); ``dense_warmup_epochs``: RedSync's dense warm-up, the first epochs
    run "2dtar". A plain dict given as ``schedule=`` means Schedule(that dict)."""
    epochs: dict = None
    dense_warmup_epochs: int = 0

    def __post_init__(self):
        from tf_commlib.collectives import ALGORITHMS

        epochs = self.epochs
        if epochs is not None:
            if not isinstance(epochs, dict) or not epochs:
                raise ValueError(f"schedule must be a non-empty dict {{epoch: algorithm}}, got {epochs!r}")
            keys = list(epochs)
            if any(not _is_int(e) or e < 0 for e in keys):
                raise ValueError(f"schedule epochs must be integers >= 0, got {keys}")
            if any(b <= a for a, b in zip(keys, keys[1:])):
                raise ValueError(f"schedule epochs must be strictly increasing, got {keys}")
            for a in epochs.values():
                if a not in ALGORITHMS and a != "auto":
                    raise ValueError(f"schedule algorithm must be one of {sorted(ALGORITHMS) + ['auto']}, got {a!r}")
            object.__setattr__(self, "epochs", dict(epochs))
        if not _is_int(self.dense_warmup_epochs) or self.dense_warmup_epochs < 0:
            raise ValueError(f"Schedule.dense_warmup_epochs must be an int >= 0, got {self.dense_warmup_epochs!r}")
        object.__setattr__(self, "dense_warmup_epochs", int(self.dense_warmup_epochs))
        if self.epochs is not None:
            object.__setattr__(self, "epochs", {int(e): a for e, a in self.epochs.items()})

    def resolve(self, algorithm):
        """{epoch: algorithm} from epoch 0, with ``algorithm`` where the schedule starts later and the
        dense warm-up in front."""
        out = dict(self.epochs or {0: algorithm})
        if 0 not in out:
            out = {0: algorithm, **out}
        if self.dense_warmup_epochs:
            n = self.dense_warmup_epochs
            later = {e: a for e, a in out.items() if e > n}
            first = [a for e, a in out.items() if e <= n][-1]
            out = {0: "2dtar", n: first, **later}
        return out


def as_schedule(schedule):
    """schedule= as a Schedule: None, a dict or a Schedule; ValueError otherwise."""
    if schedule is None:
        return Schedule()
    if isinstance(schedule, Schedule):
        return schedule
    if isinstance(schedule, dict):
        return Schedule(schedule)
    raise ValueError(f"schedule must be None, a dict {{epoch: algorithm}} or a Schedule, got {schedule!r}")


def check_density(density):
    """(target density, candidate densities): density is a number in (0, 1], "adaptive" (tyagi's
    adaptive compression ratio over CANDIDATES) or a sequence of candidate densities (adaptive over
    those); ValueError otherwise. Candidates are () unless adaptive; the target starts at the first."""
    if isinstance(density, str):
        if density != "adaptive":
            raise ValueError("density must be a number in (0, 1], 'adaptive' or a sequence of densities, "
                             f"got {density!r}")
        density = CANDIDATES
    if isinstance(density, (list, tuple)):
        candidates = tuple(density)
        if not candidates:
            raise ValueError("density: give at least one candidate density")
        for c in candidates:
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 < c <= 1.0:
                raise ValueError(f"density: candidates must be densities in (0, 1], got {candidates!r}")
        return float(candidates[0]), tuple(float(c) for c in candidates)
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    return float(density), ()


# keyword -> (group, field) of the grouped options
MOVED = {"momentum_correction": ("dgc", "momentum_correction"), "momentum": ("dgc", "momentum"),
         "nesterov": ("dgc", "nesterov"), "local_clip_norm": ("dgc", "local_clip_norm"),
         "momentum_masking": ("dgc", "momentum_masking"), "warmup": ("dgc", "warmup"),
         "selector": ("selection", "selector"), "seed": ("selection", "seed"),
         "dense_layers": ("selection", "dense_layers"), "qrgc": ("selection", "qrgc"),
         "dense_warmup_epochs": ("schedule", "dense_warmup_epochs"),
         "cost_params": ("auto", "cost_params"), "auto_margin": ("auto", "margin"),
         "auto_compute_s": ("auto", "compute_s"), "candidates": ("density", None)}
_GROUPS = {"dgc": DGC, "selection": Selection, "schedule": Schedule, "auto": Auto}


def moved_error(keyword):
    """The TypeError for a keyword that moved into a group."""
    group, field = MOVED[keyword]
    if group == "density":
        return TypeError("DistributedOptimizer: candidates= is gone: give the candidate densities as density=, "
                         "e.g. density=(0.1, 0.01, 0.001) (a sequence of densities means adaptive)")
    return TypeError(f"DistributedOptimizer: {keyword}= moved: use {group}={_GROUPS[group].__name__}({field}=...)")


def grouped(config):
    """A config with the group options as top-level keywords (MOVED; "auto" the plain argmin, margin
    1.0, where it names no margin) as grouped keywords; a grouped config is returned as it is."""
    if not any(key in MOVED for key in config):
        return dict(config)
    flat = {"auto_margin": 1.0, **config}   # saved before auto_margin existed: "auto" was the plain argmin
    out = {key: value for key, value in flat.items() if key not in MOVED}
    if flat.get("candidates") is not None and out.get("density") == "adaptive":
        out["density"] = list(flat["candidates"])
    groups = {}
    for key, (group, field) in MOVED.items():
        if group != "density" and flat.get(key) is not None:
            groups.setdefault(group, {})[field] = flat[key]
    out["schedule"] = {"epochs": out.get("schedule"), **groups.pop("schedule", {})}
    out.update(groups)
    return out


def groups_to_config(dgc, schedule, auto, selection):
    """The option groups of a DistributedOptimizer's config, as plain values (Selection without its
    dense_layers predicate, which the caller refuses to serialise)."""
    return {"dgc": dataclasses.asdict(dgc),
            "schedule": {"epochs": None if schedule.epochs is None else {str(e): a for e, a in schedule.epochs.items()},
                         "dense_warmup_epochs": schedule.dense_warmup_epochs},
            "auto": auto.to_config(),
            "selection": {"selector": selection.selector, "seed": selection.seed, "qrgc": selection.qrgc}}


def groups_from_config(config):
    """The inverse of groups_to_config on a (grouped) config: its groups as DGC, Schedule, Auto, Selection."""
    config = dict(config)
    schedule = config.pop("schedule", None) or {}
    epochs = schedule.get("epochs")
    config["schedule"] = Schedule(None if epochs is None else {int(e): a for e, a in epochs.items()},
                                  schedule.get("dense_warmup_epochs", 0))
    for key, make in (("dgc", DGC), ("selection", Selection)):
        if config.get(key) is not None:
            config[key] = make(**config[key])
    if config.get("auto") is not None:
        config["auto"] = Auto.from_config(config["auto"])
    return config


def check_flags(**values):
    """ValueError naming the first argument that is not True or False."""
    for arg, value in values.items():
        if not isinstance(value, bool):
            raise ValueError(f"{arg} must be True or False, got {value!r}")


def given(value, cls, name):
    """An options object: cls() for None, the value where it is a cls, else ValueError naming `name`."""
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise ValueError(f"{name} must be None or a tf_commlib.keras.{cls.__name__}, got {value!r}")
    return value
