"""GradientAggregator: the user entry point of the collectives. It composes the bucket plan
(bucket_plan), the consistency check (consistency_guard), the choice of "auto" (chooser) and the
residuals (residuals), and runs each bucket of a step through its collective; its halves for a
sharded update live in sharded."""
import dataclasses
import functools

import numpy as np
import tensorflow as tf

from tf_commlib import fusion, link_bytes, ops, overlap, primitives
from tf_commlib.aggregator.bucket_plan import BucketPlan
from tf_commlib.aggregator.chooser import AutoChooser, Auto
from tf_commlib.aggregator.consistency_guard import ConsistencyGuard
from tf_commlib.aggregator.residuals import ResidualStore
from tf_commlib.aggregator.sharded import ShardedHalves
from tf_commlib.collectives import ALGORITHMS, resolve_algorithm_options, with_compression
from tf_commlib.collectives import wire
from tf_commlib.collectives.interface import plain_python
from tf_commlib.topology import topology as current_topology

OPS = ("average", "sum")
SENT = ("mask", "indices")


def check_config(algorithm, density, selector, op="average", algorithm_options=None):
    """Raises ValueError for an unknown algorithm/selector/op, a density outside (0, 1] or bad
    algorithm_options ({algorithm: {option: value}}, see tf_commlib.collectives)."""
    names = [algorithm] if isinstance(algorithm, str) else list(algorithm)
    for name in names:
        if name != "auto" and name not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS) + ['auto']}, got {name!r}")
    if not names:
        raise ValueError("algorithm: give at least one")
    if selector not in ops.SELECTORS:
        raise ValueError(f"selector must be one of {sorted(ops.SELECTORS)}, got {selector!r}")
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    resolve_algorithm_options(algorithm_options)


def _tf_variable(shape, dtype, name):
    return tf.Variable(tf.zeros(shape, dtype), trainable=False, name=name)


def _sum_squares(x):
    return tf.reduce_sum(tf.square(tf.cast(x, tf.float64)))


@dataclasses.dataclass(frozen=True)
class ExecutionSettings:
    """How a GradientAggregator runs inside a training step and what it records; checked when made.

    ``check_consistency`` (default True) checks at every call that all ranks are at the same step
    with the same shapes, dtypes, algorithm, density, selector and op (one all-gather of a few
    int64 per rank, tf_commlib.consistency); False checks only the first call. ``overlap=False``
    makes every bucket wait for all of the gradients (aggregation after backprop, the baseline that
    overlap is measured against). ``track_gain``: the aggregator's ``gain`` (float64 [2])
    accumulates this rank's ||g_c||^2 and ||g_e||^2 over the sparse buckets: g_e is the input plus
    the residual, g_c what left it (g_e minus the new residual, both in input space), tyagi's
    compression gain is their ratio (tf_commlib.keras.adaptive). ``timeline``: a
    tf_commlib.overlap.Timeline that records when each bucket's aggregation starts (key ("bucket",
    ``timeline_tag``, i)). State variables come from ``variable_factory(shape, dtype, name)``
    (default tf.Variable).
    """
    check_consistency: bool = True
    overlap: bool = True
    track_gain: bool = False
    timeline: object = None
    timeline_tag: object = 0
    variable_factory: object = None

    def __post_init__(self):
        for arg in ("check_consistency", "overlap", "track_gain"):
            if not isinstance(getattr(self, arg), bool):
                raise ValueError(f"{arg} must be True or False, got {getattr(self, arg)!r}")


# keywords of options that a settings object holds -> where they are given
_MOVED = {
    "cost_params": "auto=Auto(cost_params=...)",
    "auto_margin": "auto=Auto(margin=...)",
    "auto_compute_s": "auto=Auto(compute_s=...)",
    "compression": "algorithm_options=tf_commlib.collectives.with_compression(algorithm_options, compression)",
    **{name: f"execution=ExecutionSettings({name}=...)" for name in
       ("check_consistency", "overlap", "track_gain", "timeline", "timeline_tag", "variable_factory")},
}


def _refuse_moved(init):
    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        moved = [name for name in kwargs if name in _MOVED]
        if moved:
            raise TypeError("GradientAggregator: " + "; ".join(
                f"{name} is no longer an argument, give {_MOVED[name]}" for name in moved)
                + " (tf_commlib.aggregator.Auto / ExecutionSettings)")
        init(self, *args, **kwargs)
    return checked


class GradientAggregator:
    """Aggregates a list of gradients (any shapes, None allowed) over all ranks.

    Gradients are fused into flat buckets per dtype of at most ``fusion_threshold_bytes``, packed
    in backprop order (from the last gradient: bucket 0 holds the last layers, tf_commlib.fusion.plan);
    inside tf.function a bucket's aggregation depends only on its own gradients (and the consistency
    check, which depends on none), so it runs while backprop still computes the earlier layers'
    gradients (tf_commlib.overlap). Each bucket goes through ``algorithm`` ("dense", "2dtar",
    "naive_ag", "hitopk", or "auto": the cheapest by the cost model, as ``auto``, an Auto,
    says). Sparse algorithms select ``density`` of each bucket with ``selector`` and keep what they
    did not send in a residual (error feedback) that is added back at the next call. Works eagerly
    and inside tf.function.

    ``algorithm`` may also be a list of names: ``set_algorithm`` then switches between them at
    run time (schedules); the residual of a sparse algorithm that is not running is flushed into
    the next aggregation, so nothing is lost. ``set_density`` changes the density (warm-up).
    ``algorithm_options`` = {algorithm: {option: value}} reaches each call of that collective in its
    Context, with the step and a seed (tf_commlib.collectives.Context); 16-bit values on the wire
    for every collective that takes them: tf_commlib.collectives.with_compression(options, "fp16").
    ``execution`` (ExecutionSettings): the consistency check, overlap, gain tracking, timeline and
    where state variables come from. ``sharded``: the halves of a sharded optimizer update
    (ShardedHalves).
    """

    @_refuse_moved
    def __init__(self, algorithm="hitopk", density=0.01, selector="mstopk", op="average",
                 fusion_threshold_bytes=fusion.DEFAULT_THRESHOLD_BYTES, topology=None, seed=None, *,
                 algorithm_options=None, auto=None, execution=None):
        self.auto = Auto() if auto is None else auto
        self.execution = ExecutionSettings() if execution is None else execution
        for arg, value, kind in (("auto", self.auto, Auto), ("execution", self.execution, ExecutionSettings)):
            if not isinstance(value, kind):
                raise ValueError(f"{arg} must be None or a tf_commlib.aggregator.{kind.__name__}, got {value!r}")
        check_config(algorithm, density, selector, op, algorithm_options)
        self.algorithm_options = resolve_algorithm_options(with_compression(algorithm_options, "none"))
        self.candidates = [algorithm] if isinstance(algorithm, str) else list(algorithm)
        self.initial_density, self.selector, self.op = float(density), selector, op
        self.topo = topology or current_topology()
        self.seed = seed
        self.variable_factory = self.execution.variable_factory or _tf_variable
        self.gain = None
        self.plan = BucketPlan(fusion_threshold_bytes, self.execution.timeline, self.execution.timeline_tag)
        self.chooser = AutoChooser(self.auto, self.topo, self.initial_density, self.algorithm_options, self.plan,
                                   self.execution.overlap)
        self.guard = ConsistencyGuard(self.topo, self.candidates, selector, op, self.execution.check_consistency,
                                      lambda: self.chooser.spelled_out(self.candidates))
        self.state = ResidualStore(self.topo)
        self.sharded = ShardedHalves(self)
        # True: a traced step holds only the candidate active when it was traced (``traced``), and
        # fails if run with another active; whoever sets the algorithm then traces again. False: every
        # candidate is traced (tf.switch_case), and set_algorithm needs no new trace.
        self.trace_active_only = False
        self.traced = None

    # -- configuration ------------------------------------------------------------------------
    @property
    def buckets(self):
        return self.plan.buckets

    @property
    def fusion_threshold_bytes(self):
        return self.plan.threshold_bytes

    @property
    def timeline_tag(self):
        return self.plan.timeline_tag

    @timeline_tag.setter
    def timeline_tag(self, tag):
        """The tag of this aggregator's timeline keys ("bucket", tag, i); set it before the first call."""
        self.execution = dataclasses.replace(self.execution, timeline_tag=tag)
        self.plan.timeline_tag = tag

    @property
    def residuals(self):
        """{(bucket index, algorithm name): residual variable}."""
        return self.state.residuals

    def bucket_algorithms(self, name):
        """The collective each bucket runs for candidate `name` (for "auto": the cost model's
        choice per bucket), after build."""
        return self.chooser.bucket_algorithms(name)

    # -- state -----------------------------------------------------------------------------
    def build(self, shapes_dtypes):
        """Creates the state for gradients of these (shape, dtype) (None for absent ones)."""
        if not self.plan.build(shapes_dtypes):
            return
        with tf.init_scope():
            primitives.prepare()
            make = self.variable_factory
            self.step = make((), tf.int64, "aggregator_step")
            self.density = make((), tf.float64, "aggregator_density")
            self.density.assign(self.initial_density)
            self.active = make((), tf.int32, "aggregator_algorithm")
            if self.execution.track_gain:
                self.gain = make((2,), tf.float64, "aggregator_gain")
            self.guard.build(make)
            # residuals also for auto's per-bucket choice where the step rule keeps it exact: the
            # state (and a checkpoint of it) must not depend on a measured compute_s
            self.state.build(make, self.buckets, lambda i, bucket: {
                self.chooser.resolve(c, sum(bucket.sizes), bucket.shapes, rule)
                for c in self.candidates for rule in (True, False)}, self.algorithm_options)

    def variables(self):
        return ([self.step, self.density, self.active, self.guard.owner]
                + ([self.gain] if self.gain is not None else []) + self.residual_variables())

    def residual_variables(self):
        return self.state.variables()

    def twin(self, topology=None):
        """A new aggregator with this one's configuration, its current algorithm and density, and
        fresh state (residuals, step): to time aggregation apart (profiling) without touching the
        state training uses. Call it eagerly, after build."""
        other = GradientAggregator(self.candidates, self.initial_density, self.selector, self.op,
                                   fusion_threshold_bytes=self.fusion_threshold_bytes,
                                   topology=topology or self.topo, seed=self.seed,
                                   algorithm_options=self.algorithm_options, auto=self.auto,
                                   execution=dataclasses.replace(self.execution, timeline=None, timeline_tag=0,
                                                                 variable_factory=None))
        if self.buckets is not None:
            other.build(self.plan.shapes)
            other.density.assign(self.density)
            other.active.assign(self.active)
        return other

    def reset_rank_state(self):
        """Zeroes the per-rank state (residuals): for a job that loaded another rank's state."""
        self.state.reset()
        self.guard.reset()

    def owed(self):
        """Per bucket, what this rank owes the sum (its residuals in input space, a length-d tensor):
        the same on any layout (eagerly, after build)."""
        return [self.state.owed(i, sum(b.sizes), b.dtype) for i, b in enumerate(self.buckets)]

    def take_owed(self, owed):
        """Residuals that flush ``owed`` (what owed() gave on any layout, per bucket of this plan; None:
        nothing), the rest zero, the state claimed by none. A collective over each node (hitopk's
        residuals are shards of the node's sum): every rank of the layout calls it. Returns the buckets
        none of whose residuals can hold it (owed there is dropped)."""
        self.guard.reset()
        dropped, active = [], self.candidates[int(self.active.numpy())]
        for i, bucket in enumerate(self.buckets):
            x = tf.zeros([sum(bucket.sizes)], bucket.dtype) if owed[i] is None else tf.convert_to_tensor(owed[i])
            running = self.chooser.resolve(active, sum(bucket.sizes), bucket.shapes)
            if not self.state.take_owed(i, x, running) and owed[i] is not None and np.any(owed[i]):
                dropped.append(i)
        return dropped

    def set_algorithm(self, name):
        self.active.assign(self.candidates.index(name))

    def set_density(self, density):
        check_config(self.candidates[0], density, self.selector, self.op)
        self.density.assign(density)

    # -- a step --------------------------------------------------------------------------------
    def open_step(self, grads, step=None):
        """The opening of every aggregation of ``grads`` (tensors or None): builds the state, runs
        the consistency check (``step``: the caller's step, see aggregate), makes every gradient
        wait for all of them without overlap, and checks that they fuse into the planned buckets.
        Returns the gradients to aggregate; then walk them with ``plan.walk``."""
        self.build([None if g is None else (g.shape, g.dtype) for g in grads])
        if self.topo.size > 1:
            since = overlap.op_count()
            grads = self.guard.check(grads, step, self.step, self.active, self.density)
            overlap.run_independently(since)   # depends on no gradient: nothing to chain it after
        if not self.execution.overlap:
            grads = overlap.after_all(grads)
        self.plan.check_unchanged(grads)
        return grads

    def apply_op(self, total):
        """A sum over the ranks as ``op`` asks: divided by the number of ranks for "average"."""
        if self.op == "average":
            return total / tf.cast(self.topo.size, total.dtype)
        return total

    def _select(self, seed):
        return ops.bound_selector(self.selector, seed=seed, step=self.step)

    def _run_bucket(self, i, name, flat, node_slice=False, flush=None):
        """One bucket through one algorithm, without writing any state: (aggregated sum, int64
        indices of the entries sent sparsely (empty for a dense algorithm), the new value of each of
        state.of_bucket(i) (with flush: name's only), this bucket's addition to ``gain`` (or None)).
        The residuals of the other algorithms are flushed into this call's input (their new value
        is 0). node_slice:
        the sum is only this rank's node slice (wire.node_reduce: a reduce-scatter + all-gather
        collective stops before its intra-node all-gather; any other one is sliced). flush: a boolean
        tensor, the other algorithms' residuals flushed only where it holds, and their new value
        left out (ResidualStore.flush_idle)."""
        d = flat.shape[0]
        flat, new = self.state.flush_idle(i, name, flat, flush)
        coll = ALGORITHMS[name]
        common = None if self.seed is None else self.seed + self.step * 1_000_003 + i * 7919
        ctx = coll.context(tf.convert_to_tensor(self.step), common, self.algorithm_options.get(name), i,
                           self.buckets[i].shapes)
        gain = None if self.gain is None else tf.zeros([2], tf.float64)
        if not coll.lossy:
            if node_slice and coll.sharding is not None:   # already the node slice
                agg, node_slice = wire.node_reduce(flat, self.topo, ctx.options.get("compression", "none")), False
            else:
                agg = coll.fn(flat, self.topo, ctx=ctx)
            indices = tf.zeros([0], tf.int64)
        else:
            seed = None if common is None else common * self.topo.size + self.topo.rank
            residual = self.residuals[(i, name)]
            agg, new_residual, sent = coll.fn(flat, self.topo, coll.scaled(self.density), self._select(seed), residual, ctx)
            if gain is not None:   # this rank's ||g_c||^2 (sent) and ||g_e||^2 (input + residual)
                error_fed = flat + coll.residual_to_input(tf.convert_to_tensor(residual), d, self.topo)
                sent_part = error_fed - coll.residual_to_input(new_residual, d, self.topo)
                gain = tf.stack([_sum_squares(sent_part), _sum_squares(error_fed)])
            new[name] = new_residual
            indices = tf.cast(sent, tf.int64)
        if node_slice:   # every rank holds the whole sum: keep the node slice
            agg = wire.node_slice(agg, self.topo, d)
        return agg, indices, self.state.ordered(i, new), gain

    # -- the call ----------------------------------------------------------------------------
    @plain_python
    def aggregate(self, grads, step=None, sent="mask"):
        """Returns (aggregated grads, what was sent). With sent="mask", masks[p] is 1 where grads[p]
        was sent sparsely (0 elsewhere); with sent="indices", an int64 vector of the flat indices
        into grads[p] that were sent (empty for dense algorithms; may repeat), which costs O(k)
        instead of a pass over every entry. ``step``: the caller's training step (int or int
        tensor), compared across ranks by the consistency check (default: the number of calls so
        far); a rank that skipped a step of its loop then fails on every rank at its next call."""
        out, masks, commit = self.aggregate_deferred(grads, step, sent)
        commit()
        return out, masks

    @plain_python
    def aggregate_deferred(self, grads, step=None, sent="mask", node_slices=False):
        """aggregate() that writes no state: returns (aggregated grads, what was sent, commit), where
        commit() writes the step's residuals, gain and step count. Every rank must run the
        aggregation; a caller that decides after it whether the step counts (a global finite check
        under loss scaling) calls commit() only if it does, so a skipped step leaves the state as
        it was. node_slices=True (a sharded update over the ranks of a node): instead of the
        aggregated grads, per bucket this rank's node slice of the flat average (wire.node_slice:
        local rank l of n keeps [l*s, (l+1)*s) of the bucket padded to n*s); with every algorithm
        (sparse ones and schedules too); the same on every rank of that local index."""
        if sent not in SENT:
            raise ValueError(f"sent must be one of {SENT}, got {sent!r}")
        grads = self.open_step([None if g is None else tf.convert_to_tensor(g) for g in grads], step)
        out, masks, writes, gains, pieces, finished, idle = list(grads), list(grads), [], [], [], [], []
        only = flush = None
        if self.trace_active_only and len(self.candidates) > 1:
            with tf.init_scope():
                only = self.traced = int(self.active.numpy())
                first = int(self.step.numpy())
            if not tf.executing_eagerly():
                # the others' residuals are zero after this trace's first step: flushed then only
                flush = tf.equal(tf.convert_to_tensor(self.step), first)
                tf.debugging.assert_equal(tf.convert_to_tensor(self.active), tf.constant(only, self.active.dtype),
                                          message=f"the step was traced for algorithm {self.candidates[only]!r}, "
                                                  "another one is set: trace it again (model.make_train_function(force=True))")
        for i, bucket, flat in self.plan.walk(grads, finished):
            names = [self.chooser.resolve(c, flat.shape[0], bucket.shapes) for c in self.candidates]
            if only is not None:
                names = names[only:only + 1]
            if len(names) == 1:
                agg, indices, residuals, gain = self._run_bucket(i, names[0], flat, node_slices, flush)
            else:
                branches = [(lambda n: lambda: self._run_bucket(i, n, flat, node_slices))(n) for n in names]
                agg, indices, residuals, gain = tf.switch_case(tf.convert_to_tensor(self.active), branches)
            if flush is None:
                writes += zip(self.state.of_bucket(i), residuals)
            else:
                writes += zip(self.state.of_bucket(i, names), residuals)
                idle += [var for _, var in self.state.idle(i, names[0])]
            finished.append([agg, indices, gain, *residuals])
            if gain is not None:
                gains.append(gain)
            agg = self.apply_op(agg)
            if node_slices:
                pieces.append(agg)
            else:
                fusion.unflatten(agg, bucket, out)
            if sent == "indices":
                fusion.split_indices(indices, bucket, masks)
            else:   # the op library's scatter-add: tf.scatter_nd took ~4x as long on 25M entries
                mask = ops.scatter_add(indices, tf.ones_like(indices, flat.dtype), flat.shape[0])
                fusion.unflatten(tf.minimum(mask, 1), bucket, masks)

        def commit():
            for var, value in writes:
                var.assign(value)
            if flush is not None:
                self.state.zero_idle(idle, flush)
            if gains:
                self.gain.assign_add(tf.add_n(gains))
            self.step.assign_add(1)

        return (pieces if node_slices else out), masks, commit

    @plain_python
    def __call__(self, grads, step=None):
        return self.aggregate(grads, step)[0]

    # -- bytes ---------------------------------------------------------------------------------
    def sent_bytes(self, algorithm=None, density=None):
        """{"intra": B, "inter": B} one aggregation sends per rank (averaged over the ranks), by the
        collectives' formulas, with `algorithm` (default: the first candidate) and `density`."""
        per_bucket = []
        for bucket in self.buckets or []:
            d = sum(bucket.sizes)
            name = self.chooser.resolve(algorithm or self.candidates[0], d, bucket.shapes)
            per_bucket.append(self.bucket_bytes(bucket, name, density))
        return link_bytes.add(*per_bucket)

    def bucket_bytes(self, bucket, name, density=None):
        """{"intra": B, "inter": B} per rank of one bucket through collective `name` (the formulas)."""
        d = sum(bucket.sizes)
        return ALGORITHMS[name].sent_bytes(d, self.topo.m, self.topo.n, density or self.initial_density,
                                           self.algorithm_options.get(name), bucket.shapes)
