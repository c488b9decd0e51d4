"""GradientAggregator: the user entry point of the collectives (fusion, error feedback, choice)."""
import tensorflow as tf

from tf_commlib import consistency, fusion, link_bytes, ops, overlap
from tf_commlib.alphabeta import LinkParams
from tf_commlib.collectives import (ALGORITHMS, AUTO_MARGIN, check_margin, check_seconds, choose, keep_exact,
                                    resolve_algorithm_options,
                                   with_compression)
from tf_commlib.collectives import wire
from tf_commlib.collectives.interface import plain_python
from tf_commlib.sharded_halves import ShardedHalves
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


def check_cost_params(cost_params):
    """ValueError unless cost_params is None or a tf_commlib.alphabeta.LinkParams."""
    if cost_params is not None and not isinstance(cost_params, LinkParams):
        raise ValueError("cost_params must be None or a tf_commlib.alphabeta.LinkParams (e.g. from "
                         f"tf_commlib.costmodel.calibrate), got {cost_params!r}")


def _sum_squares(x):
    return tf.reduce_sum(tf.square(tf.cast(x, tf.float64)))


def _tf_variable(shape, dtype, name):
    return tf.Variable(tf.zeros(shape, dtype), trainable=False, name=name)


class GradientAggregator(ShardedHalves):
    """Aggregates a list of gradients (any shapes, None allowed) over all ranks.

    Gradients are fused into flat buckets per dtype of at most ``fusion_threshold_bytes``, packed
    in backprop order (from the last gradient: bucket 0 holds the last layers, tf_commlib.fusion.plan);
    inside tf.function a bucket's aggregation depends only on its own gradients (and the consistency
    check, which depends on none), so it runs while backprop still computes the earlier layers'
    gradients (tf_commlib.overlap). Each bucket goes through ``algorithm`` ("dense", "2dtar", "naive_ag", "hitopk", or "auto": the
    cheapest by the cost model). Sparse algorithms select ``density`` of each bucket with
    ``selector`` and keep what they did not send in a residual (error feedback) that is added
    back at the next call. Works eagerly and inside tf.function.

    ``algorithm`` may also be a list of names: ``set_algorithm`` then switches between them at
    run time (schedules); the residual of a lossy algorithm that is not running is flushed into
    the next aggregation, so nothing is lost. ``set_density`` changes the density (warm-up).
    State variables come from ``variable_factory(shape, dtype, name)`` (default tf.Variable).
    ``algorithm_options`` = {algorithm: {option: value}} reaches each call of that collective in its
    Context, with the step and a seed (tf_commlib.collectives.Context). ``track_gain``: ``gain``
    (float64 [2]) accumulates this rank's ||g_c||^2 and ||g_e||^2 over the sparse buckets: g_e is the
    input plus the residual, g_c what left it (g_e minus the new residual, both in input space),
    tyagi's compression gain is their ratio (tf_commlib.keras.adaptive). ``compression`` ("none",
    "fp16", "bf16") sets that option of every collective that takes it (dense, 2dtar: 16-bit values on
    the wire, tf_commlib/collectives/wire.py) unless algorithm_options sets it.
    ``check_consistency`` (default True) checks at every call that all ranks are at the same step
    with the same shapes, dtypes, algorithm, density, selector and op (one all-gather of a few
    int64 per rank, tf_commlib.consistency); False checks only the first call. ``timeline``: a
    tf_commlib.overlap.Timeline that records when each bucket's aggregation starts (key ("bucket",
    ``timeline_tag``, i)). ``overlap=False`` makes every bucket wait for all of the gradients
    (aggregation after backprop, the baseline that overlap is measured against).
    ``cost_params`` (tf_commlib.alphabeta.LinkParams, e.g. from tf_commlib.costmodel.calibrate) are
    the link parameters by which "auto" chooses (default LinkParams()); ``auto_margin`` in (0, 1]:
    "auto" picks a lossy collective for a bucket only where its predicted time is at most
    auto_margin times the fastest exact one's (dense, 2dtar; collectives.choose's lossy_margin;
    default AUTO_MARGIN = 0.5; 1.0 = the plain minimum). ``auto_compute_s``: the seconds of
    forward+backward per step that overlapped buckets aggregate beside (e.g. from
    tf_commlib.costmodel.compute_seconds); a step then takes about max(compute, communication), and
    where the per-bucket choice does not bring that to auto_margin times the all-exact step
    (collectives.keep_exact), "auto" keeps every bucket exact: compression would cost accuracy and
    save too little time. None (default): not considered; ignored without overlap.
    """

    def __init__(self, algorithm="hitopk", density=0.01, selector="mstopk", op="average",
                 fusion_threshold_bytes=fusion.DEFAULT_THRESHOLD_BYTES, topology=None, seed=None,
                 cost_params=None, check_consistency=True, variable_factory=None, algorithm_options=None,
                 track_gain=False,
                 compression="none", timeline=None, timeline_tag=0, overlap=True, auto_margin=AUTO_MARGIN,
                 auto_compute_s=None):
        for arg, value in (("check_consistency", check_consistency), ("overlap", overlap)):
            if not isinstance(value, bool):
                raise ValueError(f"{arg} must be True or False, got {value!r}")
        check_cost_params(cost_params)
        self.auto_margin = check_margin(auto_margin, "auto_margin")
        self.auto_compute_s = check_seconds(auto_compute_s, "auto_compute_s")
        self._exact_only = None   # "auto" within auto_compute_s: decided once the buckets are known
        self._named = None        # the candidates, "auto" spelled out per bucket (consistency check)
        check_config(algorithm, density, selector, op, algorithm_options)
        self.algorithm_options = resolve_algorithm_options(with_compression(algorithm_options, compression))
        self.candidates = [algorithm] if isinstance(algorithm, str) else list(algorithm)
        self.initial_density, self.selector, self.op = float(density), selector, op
        self.fusion_threshold_bytes = int(fusion_threshold_bytes)
        self.topo = topology or current_topology()
        self.seed, self.cost_params = seed, cost_params
        self.check_consistency = check_consistency
        self.variable_factory = variable_factory or _tf_variable
        self.track_gain, self.gain = track_gain, None
        self.buckets = None
        self.residuals = {}  # (bucket index, algorithm name) -> variable
        self._checked = set()
        self.timeline, self.timeline_tag = timeline, timeline_tag
        self.overlap = overlap

    # -- state -----------------------------------------------------------------------------
    def build(self, shapes_dtypes):
        """Creates the state for gradients of these (shape, dtype) (None for absent ones)."""
        if self.buckets is not None:
            return
        self._shapes = list(shapes_dtypes)
        specs = [None if s is None else tf.TensorSpec(s[0], s[1]) for s in shapes_dtypes]
        self.buckets = fusion.plan(specs, self.fusion_threshold_bytes)
        with tf.init_scope():
            make = self.variable_factory
            self.step = make((), tf.int64, "aggregator_step")
            self.density = make((), tf.float64, "aggregator_density")
            self.density.assign(self.initial_density)
            self.active = make((), tf.int32, "aggregator_algorithm")
            if self.track_gain:
                self.gain = make((2,), tf.float64, "aggregator_gain")
            # 1 + the rank whose residuals these are (0: never stepped); checkpointed with them
            self.owner = make((), tf.int64, "aggregator_state_owner")
            for i, bucket in enumerate(self.buckets):
                d = sum(bucket.sizes)
                # residuals also for auto's per-bucket choice where the step rule keeps it exact: the
                # state (and a checkpoint of it) must not depend on a measured auto_compute_s
                names = {self._resolve(c, d, bucket.shapes, rule) for c in self.candidates for rule in (True, False)}
                for name in sorted(names):
                    coll = ALGORITHMS[name]
                    if coll.lossy:
                        options = coll.formula_options(self.algorithm_options.get(name), bucket.shapes, d)
                        size = coll.state_size(d, self.topo, options)
                        self.residuals[(i, name)] = make([size],
                                                         bucket.dtype, f"residual_{i}_{name}")

    def variables(self):
        return ([self.step, self.density, self.active, self.owner]
                + ([self.gain] if self.gain is not None else []) + self.residual_variables())

    def twin(self, topology=None):
        """A new aggregator with this one's configuration, its current algorithm and density, and
        fresh state (residuals, step): to time aggregation apart (profiling) without touching the
        state training uses. Call it eagerly, after build."""
        other = GradientAggregator(self.candidates, self.initial_density, self.selector, self.op,
                                   fusion_threshold_bytes=self.fusion_threshold_bytes,
                                   topology=topology or self.topo, seed=self.seed, cost_params=self.cost_params,
                                   check_consistency=self.check_consistency,
                                   algorithm_options=self.algorithm_options, track_gain=self.track_gain,
                                   overlap=self.overlap, auto_margin=self.auto_margin,
                                   auto_compute_s=self.auto_compute_s)
        if self.buckets is not None:
            other.build(self._shapes)
            other.density.assign(self.density)
            other.active.assign(self.active)
        return other

    def reset_rank_state(self):
        """Zeroes the per-rank state (residuals): for a job that loaded another rank's state."""
        for var in self.residual_variables() + [self.owner]:
            var.assign(tf.zeros(var.shape, var.dtype))

    def set_algorithm(self, name):
        self.active.assign(self.candidates.index(name))

    def set_density(self, density):
        check_config(self.candidates[0], density, self.selector, self.op)
        self.density.assign(density)

    # -- helpers ---------------------------------------------------------------------------
    def _resolve(self, name, d, shapes=None, step_rule=True):
        """name, or for "auto" the cheapest collective for a bucket of d entries (of these shapes);
        step_rule=False: the per-bucket choice alone (without auto_compute_s's rule)."""
        if name != "auto":
            return name
        exact = ([a for a in ALGORITHMS if not ALGORITHMS[a].lossy]
                 if step_rule and self._auto_exact_only() else None)
        return choose(d, self.topo.m, self.topo.n, self.initial_density, self.cost_params, candidates=exact,
                      options=self.algorithm_options, shapes=shapes, lossy_margin=self.auto_margin)

    def _auto_exact_only(self):
        """True where "auto" keeps every bucket exact (collectives.keep_exact with auto_compute_s and
        auto_margin; overlapped only; known once the buckets are)."""
        if self.auto_compute_s is None or not self.overlap or self.buckets is None:
            return False
        if self._exact_only is None:
            self._exact_only = keep_exact([(sum(b.sizes), b.shapes) for b in self.buckets], self.topo.m,
                                          self.topo.n, self.initial_density, self.auto_compute_s,
                                          self.cost_params, self.algorithm_options, self.auto_margin)
        return self._exact_only

    def bucket_algorithms(self, name):
        """The collective each bucket runs for candidate `name` (for "auto": the cost model's
        choice per bucket), after build."""
        return [self._resolve(name, sum(b.sizes), b.shapes) for b in self.buckets]

    def _select(self, seed):
        return ops.bound_selector(self.selector, seed=seed, step=self.step)

    def _check(self, grads, step):
        """Every rank must be at the same step with the same shapes, dtypes, algorithm, density,
        selector and op (tf_commlib.consistency): checked at every call with check_consistency,
        else at the first call only. Returns grads that depend on the check having passed."""
        # "auto" spelled out per bucket: ranks that resolve it differently (other cost_params or
        # auto_compute_s) fail the check instead of running different collectives (a hang)
        if self._named is None and self.buckets is not None:
            self._named = [c if c != "auto" else "auto:" + ",".join(self.bucket_algorithms(c))
                           for c in self.candidates]
        mine = consistency.readable(grads, self._named or self.candidates, self.selector, self.op)
        static = consistency.static_fingerprints(mine)
        step = self.step if step is None else step

        def check(step=step):
            owner, me = tf.convert_to_tensor(self.owner), tf.constant(self.topo.rank + 1, tf.int64)
            foreign = tf.where(tf.logical_or(tf.equal(owner, 0), tf.equal(owner, me)), tf.zeros_like(owner), owner)
            rows = consistency.check(self.topo.world, step, static, self.active, self.density,
                                     self.candidates, foreign, mine)
            with tf.control_dependencies([rows]):
                claimed = self.owner.assign(me)
            with tf.control_dependencies([claimed]):
                return tf.greater_equal(tf.size(rows), 0)   # true, once the check has passed

        if tf.executing_eagerly():
            if self.check_consistency or static not in self._checked:
                check()
                self._checked.add(static)
            return grads
        if static not in self._checked:
            # a new signature: checked while tracing (every rank traces it at the same call), before
            # any collective is traced, so a rank that cannot trace them fails with the others
            with tf.init_scope():
                check(step if isinstance(step, int) else self.step)
            self._checked.add(static)
        if self.check_consistency:
            done = check()
        else:   # in a graph: at the first step only
            done = tf.cond(tf.equal(tf.convert_to_tensor(self.step), 0), check, lambda: tf.constant(True))
        with tf.control_dependencies([done]):
            return [None if g is None else tf.identity(g) for g in grads]

    def _bucket_residuals(self, i):
        """The residual variables of bucket i (one per lossy algorithm it may run), in a fixed order."""
        return [var for (j, _), var in sorted(self.residuals.items()) if j == i]

    def _run(self, i, name, flat, node_slice=False):
        """One bucket through one algorithm, without writing any state: (aggregated sum, int64
        indices of the entries sent sparsely (empty for a dense algorithm), the new value of each of
        _bucket_residuals(i), this bucket's addition to ``gain`` (or None)). The residuals of the
        other algorithms are flushed into this call's input (their new value is 0). node_slice:
        the sum is only this rank's node slice (wire.node_reduce: a reduce-scatter + all-gather
        collective stops before its intra-node all-gather; any other one is sliced)."""
        d = flat.shape[0]
        new = {}
        for (j, other), var in self.residuals.items():  # flush residuals of idle algorithms
            if j == i and other != name:
                flat = flat + ALGORITHMS[other].residual_to_input(var, d, self.topo)
                new[other] = tf.zeros(var.shape, var.dtype)
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
            agg, new_residual, sent = coll.fn(flat, self.topo, self.density, self._select(seed), residual, ctx)
            if gain is not None:   # this rank's ||g_c||^2 (sent) and ||g_e||^2 (input + residual)
                error_fed = flat + coll.residual_to_input(tf.convert_to_tensor(residual), d, self.topo)
                sent_part = error_fed - coll.residual_to_input(new_residual, d, self.topo)
                gain = tf.stack([_sum_squares(sent_part), _sum_squares(error_fed)])
            new[name] = new_residual
            indices = tf.cast(sent, tf.int64)
        if node_slice:   # every rank holds the whole sum: keep the node slice
            agg = wire.node_slice(agg, self.topo, d)
        return agg, indices, [new[n] for (j, n) in sorted(self.residuals) if j == i], gain

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
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        self.build([None if g is None else (g.shape, g.dtype) for g in grads])
        if self.topo.size > 1:
            since = overlap.op_count()
            grads = self._check(grads, step)
            overlap.run_independently(since)   # depends on no gradient: nothing to chain it after
        if not self.overlap:
            grads = overlap.after_all(grads)
        if fusion.plan(grads, self.fusion_threshold_bytes) != self.buckets:
            raise ValueError("the gradient list changed shape since the first call; "
                             "create a new GradientAggregator for a new model")
        out, masks, writes, gains, pieces = list(grads), list(grads), [], [], []
        for i, bucket in enumerate(self.buckets):
            since = overlap.op_count()
            flat = fusion.flatten(grads, bucket)
            if self.timeline is not None:
                flat = self.timeline.stamp(("bucket", self.timeline_tag, i), flat)
            names = [self._resolve(c, flat.shape[0], bucket.shapes) for c in self.candidates]
            if len(names) == 1:
                agg, indices, residuals, gain = self._run(i, names[0], flat, node_slices)
            else:
                branches = [(lambda n: lambda: self._run(i, n, flat, node_slices))(n) for n in names]
                agg, indices, residuals, gain = tf.switch_case(tf.convert_to_tensor(self.active), branches)
            writes += zip(self._bucket_residuals(i), residuals)
            if gain is not None:
                gains.append(gain)
            if self.op == "average":
                agg = agg / tf.cast(self.topo.size, agg.dtype)
            if node_slices:
                pieces.append(agg)
            else:
                fusion.unflatten(agg, bucket, out)
            if sent == "indices":
                fusion.split_indices(indices, bucket, masks)
            else:   # the op library's scatter-add: tf.scatter_nd took ~4x as long on 25M entries
                mask = ops.scatter_add(indices, tf.ones_like(indices, flat.dtype), flat.shape[0])
                fusion.unflatten(tf.minimum(mask, 1), bucket, masks)
            overlap.run_independently(since)   # out of the program-order chain of stateful ops

        def commit():
            for var, value in writes:
                var.assign(value)
            if gains:
                self.gain.assign_add(tf.add_n(gains))
            self.step.assign_add(1)

        return (pieces if node_slices else out), masks, commit

    @plain_python
    def __call__(self, grads, step=None):
        return self.aggregate(grads, step)[0]

    def sent_bytes(self, algorithm=None, density=None):
        """{"intra": B, "inter": B} one aggregation sends per rank (averaged over the ranks), by the
        collectives' formulas, with `algorithm` (default: the first candidate) and `density`."""
        per_bucket = []
        for bucket in self.buckets or []:
            d = sum(bucket.sizes)
            name = self._resolve(algorithm or self.candidates[0], d, bucket.shapes)
            per_bucket.append(self._bucket_bytes(bucket, name, density))
        return link_bytes.add(*per_bucket)

    def _bucket_bytes(self, bucket, name, density=None):
        d = sum(bucket.sizes)
        return ALGORITHMS[name].sent_bytes(d, self.topo.m, self.topo.n, density or self.initial_density,
                                           self.algorithm_options.get(name), bucket.shapes)

    def residual_variables(self):
        return [self.residuals[k] for k in sorted(self.residuals)]
