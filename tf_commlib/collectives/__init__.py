"""Gradient aggregation collectives, one module each, written with tf_commlib.primitives.

Every collective sums a flat tensor of static length d over all ranks and returns the same result
on every rank. A module describes its algorithm completely in ``COLLECTIVE``, a Collective
(interface.py): the function, its alpha-beta time and its bytes per link. Importing this package
registers every module that defines one, in module-name order: adding a collective is adding its
module. dense.py is the shortest example: the function, ``time`` (alpha-beta seconds per phase, from
alphabeta's link parameters), ``sent_bytes`` (bytes per link, from link_bytes) and
``COLLECTIVE = Collective("dense", dense, time, sent_bytes)``. A new module runs at once as
GradientAggregator(algorithm=name), takes part in its "auto" (and, with ``auto_candidate=True``,
in DistributedOptimizer's choice per epoch), `bench comm` and the byte-count test
(tests/test_collective_interface.py), and tests/test_collectives.py checks it against a numpy
reference (lossy: each rank's own top-k with error feedback; exact: the sum) unless its module
sets ``REFERENCE`` (another of that test's references, or None where another test checks it);
``register`` adds one defined elsewhere. Value codecs (compression, value_codec) are codec.py's.

The predictions over the registry are here too: ``breakdown`` and ``predict`` (a collective's time
formula, on tf_commlib.alphabeta.LinkParams) and ``choose``: the argmin of the predictions (tyagi's
closed-form inequalities divide by zero at N = 2). algorithm="auto" runs choose with
lossy_margin=Auto.margin (default AUTO_MARGIN = 0.5): a lossy collective, which needs more
steps to reach the same accuracy, is picked only where its prediction is at most half the fastest
exact one's; choose's own default (1.0) is the plain argmin, which `bench comm` compares with the
measured fastest. The margin also applies to the step: with overlap, aggregation runs beside the
forward+backward compute (Auto.compute_s), so a step takes about max(compute, communication);
``keep_exact`` says whether the per-bucket choice fails to bring that to lossy_margin times the
all-exact step, and then "auto" keeps every bucket exact.
"""
import importlib
import pkgutil
from collections.abc import Mapping

from tf_commlib.collectives.interface import Collective, Context

__all__ = ["ALGORITHMS", "AUTO_MARGIN", "Collective", "Context", "breakdown", "bucket_bytes", "check_margin",
           "check_seconds", "choose", "keep_exact", "predict",
           "register", "setting",
           "resolve_algorithm_options", "with_compression"]

ALGORITHMS = {}   # name -> Collective


def register(collective):
    """Adds a Collective under its name (ValueError if the name is taken or is "auto")."""
    if not isinstance(collective, Collective):
        raise TypeError(f"expected a Collective, got {collective!r}")
    if collective.name in ALGORITHMS or collective.name == "auto":
        raise ValueError(f"a collective named {collective.name!r} is already registered")
    ALGORITHMS[collective.name] = collective
    return collective


def setting(spec):
    """The name of the registered collective that ``spec`` names: a registered name as it is, or
    ``BASE:KEY=VALUE[,KEY=VALUE...]``, a copy of the registered BASE at another setting (an option's
    default, or density_scale: e.g. ``powersgd:rank=1``, ``hitopk:density_scale=0.1``), registered
    under ``BASE_KEY_VALUE...`` on the first call (``powersgd_rank_1``); the same on every rank. A value
    reads as an int, else a float, else a string. ValueError naming spec for an unknown collective,
    option or bad value."""
    import dataclasses

    if not isinstance(spec, str) or not spec:
        raise ValueError(f"a collective setting must be a name or BASE:KEY=VALUE, got {spec!r}")
    base, _, rest = spec.partition(":")
    if base not in ALGORITHMS:
        raise ValueError(f"{spec!r}: unknown collective {base!r}; known: {sorted(ALGORITHMS)}")
    if not rest:
        return base
    changes = {}
    for item in rest.split(","):
        key, eq, text = item.partition("=")
        if not eq or not key or not text:
            raise ValueError(f"{spec!r}: expected BASE:KEY=VALUE[,KEY=VALUE...], got {item!r}")
        changes[key] = _value(text)
    name = "_".join([base] + [f"{k}_{v}" for k, v in sorted(changes.items())])
    coll, scale = ALGORITHMS[base], changes.pop("density_scale", 1.0)
    try:
        copy = dataclasses.replace(coll, name=name, density_scale=scale,
                                   options=coll.resolve_options(changes), auto_candidate=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{spec!r}: {e}") from None
    if name not in ALGORITHMS:
        register(copy)
    elif (ALGORITHMS[name].fn, ALGORITHMS[name].density_scale, dict(ALGORITHMS[name].options)) != \
            (copy.fn, copy.density_scale, dict(copy.options)):
        raise ValueError(f"{spec!r}: another collective is registered as {name!r}")
    return name


def _value(text):
    """text as an int, else a float, else itself."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def resolve_algorithm_options(algorithm_options):
    """{algorithm: {option: value}} -> the same with every option filled in, for the algorithms
    named; ValueError naming algorithm_options for an unknown algorithm, option or value."""
    if algorithm_options is None:
        return {}
    if not isinstance(algorithm_options, Mapping):
        raise ValueError(f"algorithm_options must be a dict {{algorithm: {{option: value}}}}, "
                         f"got {algorithm_options!r}")
    unknown = sorted(set(algorithm_options) - set(ALGORITHMS))
    if unknown:
        raise ValueError(f"algorithm_options names unknown algorithm(s) {unknown}; "
                         f"known: {sorted(ALGORITHMS)}")
    return {name: ALGORITHMS[name].resolve_options(opts) for name, opts in algorithm_options.items()}


def with_compression(algorithm_options, compression):
    """algorithm_options with compression ("none", "fp16", "bf16": 16-bit values on the wire) set for
    every registered algorithm that takes it (dense, 2dtar) where algorithm_options does not set it;
    ValueError naming compression for another value."""
    from tf_commlib.collectives.wire import COMPRESSIONS
    if not isinstance(compression, str) or compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    out = {name: dict(opts) for name, opts in (algorithm_options or {}).items()}
    if compression != "none":
        for name, coll in ALGORITHMS.items():
            if "compression" in coll.options:
                out.setdefault(name, {}).setdefault("compression", compression)
    return out


def breakdown(algorithm, d, m, n, density, params=None, options=None, shapes=None):
    """Predicted seconds per step of one call of a registered collective: {step: seconds}
    (params: alphabeta.LinkParams, default LinkParams(); shapes: the bucket's tensor shapes, see
    interface.Context, None = one flat vector)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {list(ALGORITHMS)}")
    return ALGORITHMS[algorithm].breakdown(d, m, n, density, params, options, shapes)


def predict(algorithm, d, m, n, density, params=None, options=None, shapes=None):
    """Predicted seconds of one call of `algorithm` on d float32 elements over m x n ranks
    (its module's time formula, with `options` for it; shapes as in breakdown)."""
    return float(sum(breakdown(algorithm, d, m, n, density, params, options, shapes).values()))


AUTO_MARGIN = 0.5   # the default Auto.margin of GradientAggregator and DistributedOptimizer


def bucket_bytes(names):
    """The gradient bucket size for a run that may use the collectives `names` where the user gives
    none: the largest of theirs (Collective.bucket_bytes; a lossy one's fixed costs per bucket weigh
    more than the overlap an exact one loses with larger buckets, docs/training.md)."""
    from tf_commlib import fusion

    def own(name):
        coll = ALGORITHMS[name]
        if coll.bucket_bytes is not None:
            return coll.bucket_bytes
        return fusion.LOSSY_THRESHOLD_BYTES if coll.lossy else fusion.DEFAULT_THRESHOLD_BYTES

    return max(own(n) for n in names)


def check_margin(value, name="lossy_margin"):
    """value as a float if it is a number in (0, 1]; ValueError naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
    return float(value)


def choose(d, m, n, density, params=None, candidates=None, options=None, shapes=None, lossy_margin=1.0):
    """The candidate (default: every registered collective) with the smallest predicted time, ties
    going to the earlier one; options = {algorithm: {option: value}} (algorithm_options); shapes:
    the bucket's tensor shapes (None: one flat vector of d). ``lossy_margin`` in (0, 1]: a lossy
    candidate (one that sends part of the sum and keeps the rest in a residual, so it needs more
    steps to the same accuracy) is chosen only where its prediction is at most lossy_margin times
    the fastest exact candidate's (dense, 2dtar), else that one is; 1.0 is the plain minimum."""
    lossy_margin = check_margin(lossy_margin)
    options = options or {}
    candidates = list(ALGORITHMS) if candidates is None else list(candidates)
    time = {a: predict(a, d, m, n, density, params, options.get(a), shapes) for a in candidates}
    best = min(candidates, key=time.get)
    exact = [a for a in candidates if not ALGORITHMS[a].lossy]
    if not ALGORITHMS[best].lossy or not exact:
        return best
    fastest_exact = min(exact, key=time.get)
    return best if time[best] <= lossy_margin * time[fastest_exact] else fastest_exact


def check_seconds(value, name):
    """value as a float if it is None or a finite number >= 0; ValueError naming `name` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be None or a finite number of seconds >= 0, got {value!r}")
    return float(value)


def keep_exact(buckets, m, n, density, compute_s, params=None, options=None, lossy_margin=AUTO_MARGIN):
    """True where "auto" should run every bucket exact because compressing would not make the step
    fast enough: with aggregation overlapped with the ``compute_s`` seconds of forward+backward, a
    step takes about max(compute_s, the buckets' collectives one after the other); the per-bucket
    choice (choose with lossy_margin) must make that shorter, and at most lossy_margin times the step
    with the fastest exact collective of every bucket. ``buckets``: (d, shapes) per bucket; compute_s None:
    False (not known: the per-bucket choice stands)."""
    compute_s = check_seconds(compute_s, "compute_s")
    lossy_margin = check_margin(lossy_margin)
    if compute_s is None:
        return False
    options = options or {}
    exact = [a for a in ALGORITHMS if not ALGORITHMS[a].lossy]
    exact_s = chosen_s = 0.0
    for d, shapes in buckets:
        exact_s += min(predict(a, d, m, n, density, params, options.get(a), shapes) for a in exact)
        pick = choose(d, m, n, density, params, options=options, shapes=shapes, lossy_margin=lossy_margin)
        chosen_s += predict(pick, d, m, n, density, params, options.get(pick), shapes)
    chosen_step, exact_step = max(compute_s, chosen_s), max(compute_s, exact_s)
    return not (chosen_step < exact_step and chosen_step <= lossy_margin * exact_step)


def _discover():
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if isinstance(getattr(module, "COLLECTIVE", None), Collective):
            register(module.COLLECTIVE)


_discover()
