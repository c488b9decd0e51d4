"""What a collective module declares about itself (Collective) and what the aggregator passes to
each call (Context). A module under tf_commlib.collectives that defines ``COLLECTIVE = Collective(...)``
is registered under its name; see the package docstring for an example."""
import dataclasses
import math
import types
from typing import Callable, Mapping, Optional

import tensorflow as tf

from tf_commlib.alphabeta import LinkParams


def plain_python(fn):
    """fn run without AutoGraph, also inside a caller's tf.function (as under model.fit, where Keras
    already turns it off): the library builds its graphs with tf.cond / tf.switch_case itself, and
    AutoGraph converting every function the aggregator reaches took about 20 s per process. A
    user's function reached from it (a selector, a collective's fn) must do the same, or be a
    tf.function itself. Idempotent."""
    if getattr(fn, "_tf_commlib_plain", False):
        return fn
    wrapped = tf.autograph.experimental.do_not_convert(fn)
    wrapped._tf_commlib_plain = True
    return wrapped


@dataclasses.dataclass(frozen=True)
class Context:
    """What a collective gets besides its tensor. ``step``: the aggregator's step (an int64 tensor,
    the same on every rank; 0 when called directly). ``seed``: None, or an int64 tensor that is the
    same on every rank and differs by step and bucket (mix in topo.rank for a per-rank stream).
    ``options``: the algorithm's options, defaults filled in. ``bucket``: the fused bucket's index.
    ``shapes``: the shapes of the bucket's tensors, in their order in the flat bucket (a tuple of
    tuples whose sizes sum to d; GradientAggregator passes them), or None: one flat vector of d
    (a direct call). Only a collective whose work depends on the layers (powersgd) reads it."""
    step: object = 0
    seed: object = None
    options: Mapping = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    bucket: int = 0
    shapes: Optional[tuple] = None


def check_layout(d, m, n, density):
    if min(d, m, n) < 1 or not 0 < density <= 1:
        raise ValueError(f"need d, m, n >= 1 and 0 < density <= 1, got {d}, {m}, {n}, {density}")


def check_shapes(shapes, d):
    """shapes (None, or a sequence of tensor shapes whose sizes sum to d) as a tuple of tuples of
    ints (None stays None); ValueError naming shapes otherwise."""
    if shapes is None:
        return None
    try:
        out = tuple(tuple(int(k) for k in shape) for shape in shapes)
        ok = all(k >= 0 for shape in out for k in shape) and \
            all(int(k) == k for shape in shapes for k in shape)
    except (TypeError, ValueError):
        ok = False
    if not ok or sum(math.prod(shape) for shape in out) != d:
        raise ValueError(f"shapes must be None or a list of tensor shapes (non-negative ints) whose "
                         f"sizes sum to d = {d}, got {shapes!r}")
    return out


@dataclasses.dataclass(frozen=True)
class Sharding:
    """The two halves of a dense collective that is a reduce-scatter followed by an all-gather, for
    a sharded optimizer update between them (DistributedOptimizer(shard_optimizer=True), ZeRO-1).
    The flat input of d entries is padded to a multiple of the world size P and cut into P equal
    slices in the collective's own decomposition, so the halves send what the collective sends.

    slot(topo): which of the P slices this rank owns (slice k covers [k*s, (k+1)*s), s = padded/P).
    reduce_scatter(x, topo, ctx): the sum over all ranks of this rank's slice of x (x's dtype; the
            option compression sends 16-bit values as the collective does).
    all_gather(piece, topo, name=None): every rank's slice (any dtype, e.g. 16-bit weight deltas),
            concatenated into the padded flat vector in slice order (name: of its ops, the same on
            every rank, for graphs whose ops differ by rank).
    bytes(d, m, n, options): {"intra": B, "inter": B} per rank of both halves (link_bytes).
    """
    slot: Callable
    reduce_scatter: Callable
    all_gather: Callable
    bytes: Callable


@dataclasses.dataclass(frozen=True, eq=False)
class Collective:
    """Everything about one aggregation algorithm.

    fn:     dense: fn(x, topo, ctx=None) -> sum over all ranks of the flat tensor x;
            lossy: fn(x, topo, density, select, residual=None, ctx=None) -> (sum, new residual,
            indices of x this rank's selection sent); the same result on every rank.
    time:   time(d, m, n, density, params, options) -> {step: seconds}, the alpha-beta prediction
            for d float32 entries on m nodes x n ranks with alphabeta.LinkParams (and its helpers).
    bytes:  bytes(d, m, n, density, options) -> {"intra": B, "inter": B} sent per call, averaged
            over the ranks, by the convention of tf_commlib.link_bytes (use link_bytes.per_rank).
    lossy (the result is not the exact sum; the collective keeps error-feedback state),
    state_size(d, topo, options=None), residual_to_input(residual, d, topo): for error
            feedback (the length of the per-rank state, which may hold more than the residual, e.g.
            PowerSGD's Q; the latter maps it to what this rank adds to its input to flush it).
    input_to_residual(x, d, topo, residual): optional, the way back, for state that moves to another
            layout (tf_commlib.elastic): the state (of ``residual``'s length) on ``topo`` that flushes
            what the ranks' x (each rank's owed addition to its input, length d) add up to; the sum
            over the ranks of residual_to_input of its results equals the sum of their x. ``residual``:
            the state as loaded (the commit's where the layout kept its length, else zero), from which
            a part that is alike on every rank may be kept (PowerSGD's Q). Called by every rank of the
            layout at once, it may be a collective (hitopk's: the node's sum, reduce-scattered).
    options: {name: default} that the aggregator's ``algorithm_options[name]`` may override;
    check_options(options) raises ValueError for a bad value (options has every name filled in).
    actual_bytes: for a collective whose bytes depend on which entries the ranks selected (the
            fill-in of SparCML's streams): actual_bytes(index_sets, d, m, n, options) -> what
            ``bytes`` gives, computed from index_sets[r], the indices rank r selected (numpy); its
            ``bytes`` is then the expectation for independent uniformly random indices.
    sharding: a Sharding where the collective is a reduce-scatter + all-gather that a sharded
            optimizer update may split (dense, 2dtar); None otherwise.
    bucket_bytes: the gradient bucket size it runs with where the user gives none (None:
            tf_commlib.fusion.LOSSY_THRESHOLD_BYTES for a lossy collective, else DEFAULT_THRESHOLD_BYTES).
    auto_candidate: True: DistributedOptimizer(algorithm="auto") weighs it each epoch where
            Auto(candidates=...) names none (tf_commlib.aggregator.chooser.default_candidates).
    density_scale: a lossy collective runs at the optimizer's density times this (in (0, 1]; e.g. a
            registered copy of hitopk at 0.1: a tenth of the density). fn, time and bytes get the
            scaled density from the aggregator and from breakdown / sent_bytes / sent_bytes_for.
    A layout the algorithm cannot run on gets time {"unsupported": math.inf}, so `auto` skips it.
    shapes: breakdown, sent_bytes, sent_bytes_for and context take ``shapes=`` (see Context; None:
            one flat vector of d). The formulas (time, bytes, actual_bytes, state_size) keep
            their signatures and get the shapes as ``options["shapes"]`` where the caller knows them
            (``formula_options``; GradientAggregator always passes its buckets'); the key is absent
            otherwise, so a formula that depends on the layers reads ``options.get("shapes")``.
    """
    name: str
    fn: Callable
    time: Callable
    bytes: Callable
    lossy: bool = False
    state_size: Optional[Callable] = None
    residual_to_input: Optional[Callable] = None
    input_to_residual: Optional[Callable] = None
    options: Mapping = dataclasses.field(default_factory=dict)
    check_options: Optional[Callable] = None
    actual_bytes: Optional[Callable] = None
    sharding: Optional[Sharding] = None
    bucket_bytes: Optional[int] = None
    auto_candidate: bool = False
    density_scale: float = 1.0

    def __post_init__(self):
        if not isinstance(self.auto_candidate, bool):
            raise TypeError(f"collective {self.name!r}: auto_candidate must be True or False, "
                            f"got {self.auto_candidate!r}")
        if self.lossy and not (self.state_size and self.residual_to_input):
            raise TypeError(f"lossy collective {self.name!r} needs state_size and residual_to_input")
        if self.bucket_bytes is not None and (isinstance(self.bucket_bytes, bool)
                                              or not isinstance(self.bucket_bytes, int) or self.bucket_bytes < 0):
            raise TypeError(f"collective {self.name!r}: bucket_bytes must be None or an int >= 0, "
                            f"got {self.bucket_bytes!r}")
        scale = self.density_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1 \
                or (scale != 1 and not self.lossy):
            raise TypeError(f"collective {self.name!r}: density_scale must be a number in (0, 1] "
                            f"(1 for an exact collective), got {scale!r}")
        object.__setattr__(self, "density_scale", float(scale))
        if not callable(self.fn):
            raise TypeError(f"collective {self.name!r}: fn must be callable, got {self.fn!r}")
        object.__setattr__(self, "fn", plain_python(self.fn))

    def resolve_options(self, options=None):
        """The defaults updated with `options`; ValueError for an unknown name or a bad value."""
        if options is not None and not isinstance(options, Mapping):
            raise ValueError(f"algorithm_options[{self.name!r}] must be a dict, got {options!r}")
        unknown = sorted(set(options or {}) - set(self.options))
        if unknown:
            raise ValueError(f"algorithm_options[{self.name!r}]: unknown option(s) {unknown}; "
                             f"{self.name} takes {sorted(self.options) or 'none'}")
        merged = {**self.options, **(options or {})}
        if self.check_options:
            self.check_options(merged)
        return merged

    def formula_options(self, options=None, shapes=None, d=None):
        """What the formulas get: resolve_options(options), plus "shapes" (checked against d) where
        shapes is not None."""
        resolved = self.resolve_options(options)
        if shapes is None:
            return resolved
        return {**resolved, "shapes": check_shapes(shapes, d)}

    def context(self, step=0, seed=None, options=None, bucket=0, shapes=None):
        return Context(step, seed, types.MappingProxyType(self.resolve_options(options)), bucket,
                       None if shapes is None else tuple(tuple(s) for s in shapes))

    def scaled(self, density):
        """The density this collective runs at where the optimizer's is `density` (density_scale)."""
        return density if self.density_scale == 1.0 else density * self.density_scale

    def breakdown(self, d, m, n, density, params=None, options=None, shapes=None):
        """Predicted seconds per step of one call at the optimizer's `density` (scaled: density_scale)."""
        check_layout(d, m, n, density)
        options = self.formula_options(options, shapes, d)
        return self.time(d, m, n, self.scaled(density), params or LinkParams(), options)

    def sent_bytes(self, d, m, n, density, options=None, shapes=None):
        """{"intra": B, "inter": B} one call sends, averaged over the ranks."""
        check_layout(d, m, n, density)
        return self.bytes(d, m, n, self.scaled(density), self.formula_options(options, shapes, d))

    def sharded_bytes(self, d, m, n, options=None):
        """{"intra": B, "inter": B} of the sharding's reduce-scatter + all-gather of d entries."""
        check_layout(d, m, n, 1.0)
        if self.sharding is None:
            raise ValueError(f"{self.name} has no sharded form (reduce-scatter + all-gather)")
        return self.sharding.bytes(d, m, n, self.resolve_options(options))

    def sent_bytes_for(self, index_sets, d, m, n, density, options=None, shapes=None):
        """sent_bytes for the ranks' actual selections (index_sets[r]: rank r's indices), exact
        for a data-dependent collective (actual_bytes), else sent_bytes."""
        if self.actual_bytes is None:
            return self.sent_bytes(d, m, n, density, options, shapes)
        check_layout(d, m, n, density)
        return self.actual_bytes(index_sets, d, m, n, self.formula_options(options, shapes, d))
