"""Gradient aggregation collectives, one module each, written with tf_commlib.primitives.

Every collective sums a flat tensor of static length d over all ranks and returns the same result
on every rank. A module describes its algorithm completely in ``COLLECTIVE``, a Collective
(interface.py): the function, its alpha-beta time and its bytes per link. Importing this package
registers every module that defines one, in module-name order: adding a collective is adding its
module, e.g. tf_commlib/collectives/ring.py:

    from tf_commlib import costmodel as C, link_bytes as L, primitives as P
    from tf_commlib.collectives.interface import Collective

    def ring(x, topo, ctx=None):
        return P.allreduce(x, topo.world)

    def time(d, m, n, density, params, options):
        a, b = C.world_link(m, params)
        return {"allreduce": C.ring_allreduce(C.BYTES * d, m * n, a, b)}

    def sent_bytes(d, m, n, density, options):
        return L.per_rank("allreduce", C.BYTES * d, "world", m, n)

    COLLECTIVE = Collective("ring", ring, time, sent_bytes)

It then runs as GradientAggregator(algorithm="ring"), takes part in "auto", `bench comm` and the
byte-count test (tests/test_link_bytes.py); ``register`` adds one defined elsewhere.
"""
import importlib
import pkgutil
from collections.abc import Mapping

from tf_commlib.collectives.interface import Collective, Context

__all__ = ["ALGORITHMS", "Collective", "Context", "register", "resolve_algorithm_options"]

ALGORITHMS = {}   # name -> Collective


def register(collective):
    """Adds a Collective under its name (ValueError if the name is taken or is "auto")."""
    if not isinstance(collective, Collective):
        raise TypeError(f"expected a Collective, got {collective!r}")
    if collective.name in ALGORITHMS or collective.name == "auto":
        raise ValueError(f"a collective named {collective.name!r} is already registered")
    ALGORITHMS[collective.name] = collective
    return collective


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


def _discover():
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if isinstance(getattr(module, "COLLECTIVE", None), Collective):
            register(module.COLLECTIVE)


_discover()
