"""Keras 3 distributed optimizer: gradients averaged over all Horovod ranks, through any collective of
tf_commlib.collectives, with DGC's and RedSync's accuracy techniques, for model.fit (jit_compile=False)
and custom GradientTape loops.

Momentum correction (DGC eqs. 4 and 6): the momentum lives here, not in the wrapped optimizer. Each
step u <- m*u + g (local momentum), and u (Nesterov: m*u + g) is what gets aggregated; the collective's
error feedback accumulates it (v <- v + u) and sends the top entries of v. The wrapped optimizer then
takes a *plain* step with the averaged update: a keras.optimizers.SGD, or an optimizer whose class sets
``movable_momentum = True`` (pto.LARS), steps through a copy of it without momentum (the optimizer
given is left as it is), so momentum is never applied twice; any other wrapped optimizer needs
``DGC(momentum=...)`` and keeps its own adaptive rule on top of the aggregated update.

Mixed precision (mixed_float16): loss scaling stays in a LossScaleOptimizer *around* the
DistributedOptimizer, so the gradients are unscaled before they reach DGC momentum and the residuals:
``tf_commlib.keras.LossScaleOptimizer(DistributedOptimizer(opt))``, whose finite check is global (one
1-element allreduce per step): every rank applies or skips a step together. The
keras.optimizers.LossScaleOptimizer that Keras' compile puts around a DistributedOptimizer is made
global by ``global_loss_scale(model)`` (CompileGuard, in default_callbacks(), calls it when fit
starts).
"""

import weakref

import keras
import numpy as np
import tensorflow as tf

from tf_commlib import fusion, internals, link_bytes
from tf_commlib.aggregator import Auto, ExecutionSettings, GradientAggregator, check_config
from tf_commlib.collectives import bucket_bytes, with_compression
from tf_commlib.collectives.interface import plain_python
from tf_commlib.keras.auto_epoch import AutoEpochs
from tf_commlib.auto.measure import Measurements
from tf_commlib.keras import step
from tf_commlib.keras.groups import Group
from tf_commlib.keras.options import (DGC, MOVED, Selection, as_schedule, check_density, check_flags, default_dgc,
                                      given, grouped, groups_from_config, groups_to_config, moved_error)
from tf_commlib.keras.policy import (EpochPlan, default_dense_layers, default_fusion_threshold,  # noqa: F401
                                     qrgc_options)
from tf_commlib.keras.sharded import ShardedUpdate, check_shardable
from tf_commlib.keras.wrapping import (WRAPPED, WRAPPERS, InnerSteps, check_optimizer,  # noqa: F401 (re-exported)
                                       distributed_optimizer, momentum_handover)
from tf_commlib.topology import topology as current_topology

@keras.saving.register_keras_serializable(package="tf_commlib")
class DistributedOptimizer(InnerSteps, keras.optimizers.Optimizer):
    """Wraps a Keras 3 optimizer; gradients are averaged over all Horovod ranks before its step.

    Args (all but ``optimizer`` keyword-only):
      optimizer: the Keras 3 optimizer to wrap (left unchanged; see the module doc for momentum).
      algorithm: the collective (tf_commlib.collectives), or "auto" (the default): each epoch the
        candidate of Auto.candidates with the least predicted time to accuracy on the measured link
        (tf_commlib.keras.auto_epoch; CompressionScheduler, in default_callbacks(), drives it).
      density: the fraction of entries a lossy collective sends; "adaptive" (tyagi's adaptive
        compression ratio over (0.1, 0.033, 0.011, 0.004, 0.001), driven by the callback
        tf_commlib.keras.AdaptiveDensity) or a sequence of candidate densities to adapt over.
      compression: "none", "fp16" or "bf16": 16-bit values on the wire of the dense collectives
        (dense, 2dtar; the dense-layer group included), as Horovod's Compression.fp16.
      dgc: a DGC (momentum correction, local clipping, momentum masking, warm-up); default DGC(),
        and DGC(warmup=AUTO_WARMUP) (2 epochs) where the schedule runs "auto".
      schedule: {epoch: algorithm} or a Schedule (with RedSync's dense warm-up): the collective
        switches at epoch boundaries, e.g. {0: "hitopk", 13: "2dtar"} (shi2021's DAWNBench recipe).
      auto: an Auto (link parameters, compute seconds, candidates, switch and drift) for "auto".
      selection: a Selection (top-k selector, seed, which variables go dense, RedSync's qRGC).
      fusion_threshold_bytes: the most bytes of one bucket; default None: the largest bucket size of
        the collectives the schedule names (tf_commlib.collectives.bucket_bytes: 25 MB where one is
        lossy, 1 MB for exact ones); "auto" starts at 1 MB and takes a lossy candidate's size where
        its timed aggregation is the fastest by Auto.switch; the dense-layer group keeps 1 MB.
      overlap: False makes aggregation wait for the whole of backprop (the fp32 baseline of the
        benchmarks). By default each bucket is aggregated as soon as its gradients exist, while
        backprop goes on (tf_commlib.overlap; buckets are packed from the last layer).
      shard_optimizer: True shards the wrapped optimizer's update and state over the ranks (ZeRO-1,
        tf_commlib.keras.sharded): over all P ranks with one dense / 2dtar algorithm, else over the
        ranks of a node; SGD, Adam(W), pto.LARS, pto.LAMB.
      algorithm_options: {algorithm: {option: value}} (see tf_commlib.collectives).
      name: the optimizer's name (default "distributed_" + the wrapped one's).
    Setting ``timeline`` to a tf_commlib.overlap.Timeline before the first step records when each
    gradient reaches apply() and when each bucket's aggregation starts. The epoch-driven parts
    (warm-up, schedule) follow ``set_epoch``, which the callback CompressionScheduler calls.
    """

    def __init__(self, optimizer, *, algorithm="auto", density=0.01, compression="none", dgc=None,
                 schedule=None, auto=None, selection=None, fusion_threshold_bytes=None,
                 overlap=True, shard_optimizer=False, algorithm_options=None, **kwargs):
        name = kwargs.pop("name", None)
        for key in kwargs:
            raise moved_error(key) if key in MOVED else TypeError(
                f"DistributedOptimizer got an unexpected keyword argument {key!r}")
        check_optimizer(optimizer)
        if not isinstance(algorithm, str):
            raise ValueError(f"algorithm must be the name of a collective or 'auto' (a schedule switches between "
                             f"several: schedule={{epoch: algorithm}}), got {algorithm!r}")
        auto, schedule = given(auto, Auto, "auto"), as_schedule(schedule)
        dgc = default_dgc(schedule.resolve(algorithm)) if dgc is None else given(dgc, DGC, "dgc")
        selection = given(selection, Selection, "selection")
        target, candidates = check_density(density)
        check_config(algorithm, target, selection.selector, algorithm_options=algorithm_options)
        with_compression(algorithm_options, compression)   # ValueError naming a bad compression
        check_flags(overlap=overlap, shard_optimizer=shard_optimizer)
        if fusion_threshold_bytes is not None and (isinstance(fusion_threshold_bytes, bool)
                                                   or not isinstance(fusion_threshold_bytes, int)
                                                   or fusion_threshold_bytes < 0):
            raise ValueError(f"fusion_threshold_bytes must be None or an int >= 0, got {fusion_threshold_bytes!r}")
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name must be None or a string, got {name!r}")
        if shard_optimizer:
            check_shardable(optimizer)
        stepping, m, nesterov = momentum_handover(optimizer, dgc)
        super().__init__(learning_rate=0.0, name=name or "distributed_" + optimizer.name)
        WRAPPED.add(optimizer)
        self.inner_optimizer, self.m, self.nesterov = stepping, m, nesterov
        self.algorithm, self.compression, self.algorithm_options = algorithm, compression, algorithm_options
        self.dgc, self.selection, self.auto, self.schedule_options = dgc, selection, auto, schedule
        self.plan = EpochPlan(schedule.resolve(algorithm), dgc, target, candidates)
        self.fusion_arg, self.overlap = fusion_threshold_bytes, overlap   # fusion_arg: as given (None: default)
        # the given size, else the collectives' (bucket_cap), fitted to the model when built (size_buckets)
        self.bucket_cap = (default_fusion_threshold(self.plan.schedule.values())
                           if fusion_threshold_bytes is None else fusion_threshold_bytes)
        self.fusion_threshold_bytes = self.bucket_cap
        self.shard_optimizer = shard_optimizer
        self.dense_layers = selection.dense_layers or default_dense_layers
        self._density_arg = density if isinstance(density, str) else (list(candidates) or target)
        self._sharded = None
        self._epoch = 0
        self.auto_epochs = None   # AutoEpochs where the schedule runs "auto" (made by build)
        self.measurements = Measurements()   # what "auto" measured on the cluster (filled by build)
        self._traced_ref = None   # a weak reference to the train function the last epoch ran (new_trace)

    # -- the epoch plan ----------------------------------------------------------------------
    @property
    def schedule(self):
        """{epoch: algorithm} from epoch 0."""
        return self.plan.schedule

    @property
    def target_density(self):
        return self.plan.target_density

    @property
    def candidates(self):
        return self.plan.candidates

    @property
    def adaptive(self):
        return self.plan.adaptive

    def density_at(self, epoch):
        return self.plan.density_at(epoch)

    def algorithm_at(self, epoch):
        """The collective of the compressible variables at this epoch: the schedule's, and for
        "auto" the candidate chosen (once built and chosen; "auto" before)."""
        name = self.plan.algorithm_at(epoch)
        if name == "auto" and self.auto_epochs is not None and self.auto_epochs.tta.current is not None:
            return self.auto_epochs.tta.current
        return name

    def set_target_density(self, density):
        """The density after warm-up (AdaptiveDensity's choice); takes effect without retracing (the
        aggregators' density is a variable that feeds k)."""
        check_config(self.plan.algorithm_at(0), density, self.selection.selector)
        self.plan.target_density = float(density)

    def set_epoch(self, epoch):
        """Sets density and collective for an epoch (called by CompressionScheduler); before the
        optimizer is built (the first step builds it) the epoch is kept and applied by build()."""
        self._epoch = epoch
        if getattr(self, "_groups", None):
            self._apply_epoch(epoch)

    def _apply_epoch(self, epoch):
        # eagerly: build() runs while Keras traces the first train step, where an assign would only
        # be recorded in that graph (and never run)
        with tf.init_scope():
            name = self.plan.algorithm_at(epoch)
            if self.auto_epochs is not None:   # None: the schedule left "auto" (its DiLoCo rounds end)
                chosen = self.auto_epochs.choose(epoch) if name == "auto" else None
                self.auto_epochs.begin_window(chosen)
                name = chosen or name
            for group in self._groups:
                if group.lossy:
                    group.aggregator.set_density(self.density_at(epoch))
                    if name in group.aggregator.candidates:   # not "diloco" (no collective: AutoEpochs runs it)
                        group.aggregator.set_algorithm(name)

    def stale_trace(self):
        """True where a traced step holds another collective than the one set (algorithm "auto"
        switched), on any rank: the step must be traced again (CompressionScheduler does). A
        collective for "auto" (every rank calls it at the same epoch); ValueError on every rank
        where the ranks chose differently."""
        if self.auto_epochs is None or not self.built:
            return False
        return self.auto_epochs.agree()

    def set_fit_epochs(self, epochs, steps_per_epoch=None):
        """The epoch at which the running fit ends (CompressionScheduler: fit's ``epochs``) and its steps
        per epoch (fit's ``steps``; None: not known); "auto" weighs each candidate over the epochs up to
        it (AutoEpochs.horizon) and times the candidates before the first step only where those steps
        can earn the timing back (measure.probe_candidates). None: the next epoch. A custom loop calls it
        before its first step."""
        self.fit_epochs = None if epochs is None else int(epochs)
        self.fit_steps = None if steps_per_epoch is None else int(steps_per_epoch)

    def end_epoch(self, epoch, step_s, steps=None, first_s=None, traced=False, mean_s=None):
        """An epoch ended, as CompressionScheduler measured it: for "auto", what the next choice
        learns from (AutoEpochs.end_epoch; a collective on every rank)."""
        if self.auto_epochs is not None and self.built and self.plan.algorithm_at(epoch) == "auto":
            self.auto_epochs.end_epoch(epoch, step_s, steps, first_s, traced, mean_s)

    @property
    def state_differs_by_node(self):   # the wrapped optimizer's, in auto's "diloco" (not broadcast)
        return self.auto_epochs is not None and self.auto_epochs.running_local()

    def end_step(self):
        """Nothing: the step counts itself (count_step). Kept so that a loop that calls it after each
        step runs unchanged."""

    def _counts_steps(self):
        """Where the traced step runs auto's "diloco" (it counts its steps and syncs every H of them); a
        step traced with a per-step collective has no py_function: a change in or out of the rounds
        traces the step again (stale_trace)."""
        return self.auto_epochs is not None and self.auto_epochs.running_local()

    def _step_done(self):
        if self.built:
            self.auto_epochs.end_step()

    def finalize_variable_values(self, var_list):
        """The end of model.fit: synchronize() (auto's "diloco"), so that every rank ends with the same
        weights."""
        super().finalize_variable_values(var_list)
        self.synchronize()

    def synchronize(self):
        """Every rank's weights made the same where auto's "diloco" runs (at an epoch's end). A collective."""
        if self.auto_epochs is not None and self.built:
            self.auto_epochs.synchronize()

    def new_trace(self, train_function):
        """Whether train_function (a model's) is another than the one the last epoch ran with, which
        then traces the step in its first batch (what "auto" weighs a change of collective by); kept
        on the optimizer: a later fit with new callbacks reuses the model's train function."""
        new = self._traced_ref is None or self._traced_ref() is not train_function
        self._traced_ref = weakref.ref(train_function)
        return new

    @property
    def auto_log(self):
        """"auto"'s decisions and measured epochs, one dict each ({"epoch", "choice",
        "predicted_s", "unit", "inputs", ...} for a choice; {"epoch", "ran", "measured_s", "efficiency", ...} for an
        epoch that ran); [] without "auto". Rank 0 prints a line for each change of choice."""
        return [] if self.auto_epochs is None else list(self.auto_epochs.tta.log)

    @property
    def calibrated_link(self):
        """The LinkParams "auto" measured (None before build, or where Auto(cost_params=...) gave them)."""
        return self.measurements.link

    @property
    def probed(self):
        """{candidate: seconds} of each candidate's aggregation timed on the link (None: not timed)."""
        return self.measurements.probed

    @property
    def probed_warmup(self):
        """{candidate: {density: seconds}}: the same at the DGC warm-up's densities."""
        return self.measurements.probed_warmup

    def use_bucket_cap(self, cap, variables):
        """The compressible variables' bucket size fitted from ``cap`` bytes (auto: a lossy candidate's
        size where its timed aggregation is the fastest, tf_commlib.auto.measure.lossy_bucket_bytes)."""
        self.bucket_cap = cap
        self.size_buckets(variables)

    # -- state -----------------------------------------------------------------------------
    timeline = None   # a tf_commlib.overlap.Timeline (set before the first step), or None
    fit_epochs = fit_steps = None   # set_fit_epochs

    def size_buckets(self, variables):
        """Where no fusion_threshold_bytes was given: the compressible variables' bucket size for
        these model variables, bucket_cap fitted to their bytes (fusion.bucket_threshold)."""
        if self.fusion_arg is None:
            self.fusion_threshold_bytes = fusion.bucket_threshold(
                self.bucket_cap, [v for v in variables if not self.dense_layers(v)])

    def _factory(self, shape, dtype, name):
        return self.add_variable(shape=shape, dtype=tf.as_dtype(dtype).name, initializer="zeros",
                                 name=name, aggregation="none")

    def build(self, var_list):
        if self.built:
            return
        topo, sel = current_topology(), self.selection
        self.size_buckets(var_list)
        dense_idx = [i for i, v in enumerate(var_list) if self.dense_layers(v)]
        lossy_idx = [i for i, v in enumerate(var_list) if not self.dense_layers(v)]
        names = sorted(set(self.schedule.values()), key=list(self.schedule.values()).index)
        # without overlap nothing hides under backprop: auto's compute seconds do not count
        auto = self.auto if self.overlap else Auto(self.auto.cost_params, self.auto.margin)
        compression = self.compression
        if "auto" in names:   # the candidates by time to accuracy; the exact ones 16-bit by default
            at = names.index("auto")
            names = names[:at] + [c for c in self.auto.candidates if c not in names] + names[at + 1:]
            compression = "fp16" if compression == "none" else compression
            self.auto_epochs = AutoEpochs(self)

        def aggregator(algorithm, selector, fusion, options=self.algorithm_options):
            return GradientAggregator(algorithm, self.target_density, selector, topology=topo,
                                      fusion_threshold_bytes=fusion, seed=sel.seed,
                                      algorithm_options=with_compression(options, compression), auto=auto,
                                      execution=ExecutionSettings(track_gain=self.adaptive, timeline=self.timeline,
                                                                  variable_factory=self._factory))

        groups = []
        if sel.qrgc and len(lossy_idx) > 1:
            groups.append(Group(aggregator(names, "qrgc", 0, qrgc_options(self.algorithm_options)),
                                lossy_idx[:-1], True))
            lossy_idx = lossy_idx[-1:]
        groups.append(Group(aggregator(names, sel.selector, self.fusion_threshold_bytes), lossy_idx, True))
        exact = "2dtar" if topo.m > 1 and topo.n > 1 else "dense"
        groups.append(Group(aggregator([exact], sel.selector, bucket_bytes([exact]) if self.fusion_arg is None
                                       else self.fusion_arg), dense_idx, False))
        self._groups = [g for g in groups if g.indices]
        if self.auto_epochs is not None:   # one candidate traced at a time (CompressionScheduler retraces)
            for group in groups:
                group.aggregator.trace_active_only = group.lossy
        for tag, group in enumerate(self._groups):
            group.aggregator.timeline_tag = tag
            group.aggregator.build([(var_list[i].shape, var_list[i].dtype) for i in group.indices])
        self.velocities = [self.add_variable_from_reference(v, "dgc_momentum")
                           for v in var_list] if self.dgc.momentum_correction else []
        if self.auto_epochs is not None:
            self.auto_epochs.build(var_list, [i for g in self._groups if g.lossy for i in g.indices])
        if self.shard_optimizer:   # the inner optimizer's state only for this rank's slices
            self._sharded = ShardedUpdate(self, var_list, self._groups)
        else:
            self.inner_optimizer.build(var_list)
        super().build(var_list)
        self._apply_epoch(self._epoch)

    def reset_rank_state(self):
        """Zeroes the per-rank state (residuals, DGC momentum, the slices of a sharded update), e.g. after
        loading weights that one rank saved for all (the consistency check refuses another rank's state
        otherwise)."""
        if not self.built:
            return
        if self._sharded is not None:   # the rank's slices of the optimizer state
            self._sharded.reset()
        for group in self._groups:
            group.aggregator.reset_rank_state()
        if self.auto_epochs is not None:   # the residual of its DiLoCo rounds
            self.auto_epochs.reset_rank_state()
        for u in self.velocities:
            u.assign(tf.zeros(u.shape, u.dtype))

    def rank_state(self):
        """This rank's per-rank state in a form any layout can take (load_rank_state): per variable of
        the step's list (None where its group is exact), the flat gradient it owes the sum (its
        residuals in input space), DGC's momentum per variable, and auto's DiLoCo rounds' residual.
        Numpy arrays, eagerly, after build; None before."""
        if not self.built:
            return None
        owed = [None] * (1 + max(i for g in self._groups for i in g.indices))
        for group in self._groups:
            if not group.lossy:
                continue
            agg = group.aggregator
            for bucket, flat in zip(agg.buckets, agg.owed()):
                for p, piece in zip(bucket.positions, np.split(np.asarray(flat), np.cumsum(bucket.sizes)[:-1])):
                    owed[group.indices[p]] = piece
        rounds = self.auto_epochs.local if self.auto_epochs is not None else None   # auto's DiLoCo rounds
        return {"owed": owed, "momentum": [np.asarray(u.numpy()) for u in self.velocities],
                "rounds": rounds.rank_state() if rounds is not None else None}

    def load_rank_state(self, state):
        """This rank's rank_state() of any layout (None: a rank that owes nothing, e.g. one that joined)
        into this optimizer's residuals, DGC momentum and auto's DiLoCo rounds' residual (where this
        rank holds the same slice of its node: diloco_sync.Syncs.load_rank_state); a sharded update's
        slices are left as they are. A collective over each node (hitopk-like residuals are shards of the
        node's sum): every rank of the layout calls it, before the step is traced (a residual of an
        algorithm the traced step does not run is flushed at a trace's first step). Returns how many
        variables' owed entries no residual of this layout can hold (a group that runs no lossy
        collective here), plus 1 for a DiLoCo slice that moved: those are dropped."""
        if not self.built:
            raise ValueError("load_rank_state needs a built optimizer (bind or build it first)")
        owed = state["owed"] if state is not None else []
        momentum = state["momentum"] if state is not None else []
        count = 1 + max(i for g in self._groups for i in g.indices)
        if owed and len(owed) != count:   # checked before any collective: a rank that raises stops no other
            raise ValueError(f"state: owed entries for {len(owed)} variables, this optimizer steps {count}")
        per_group = []
        for group in self._groups:
            if not group.lossy:
                continue
            per_bucket = []
            for bucket in group.aggregator.buckets:
                pieces = [owed[group.indices[p]] if owed else None for p in bucket.positions]
                if any(x is not None and np.size(x) != size for x, size in zip(pieces, bucket.sizes)):
                    raise ValueError(f"state: owed entries of sizes {[np.size(x) for x in pieces]} for variables "
                                     f"of {list(bucket.sizes)}")
                per_bucket.append(None if all(x is None for x in pieces) else np.concatenate(
                    [np.zeros(size, bucket.dtype.as_numpy_dtype) if x is None else np.asarray(x, bucket.dtype.as_numpy_dtype)
                     for x, size in zip(pieces, bucket.sizes)]))
            per_group.append((group, per_bucket))
        if momentum and self.velocities and [tuple(u.shape) for u in self.velocities] != [np.shape(m) for m in momentum]:
            raise ValueError(f"state: DGC momentum of shapes {[np.shape(m) for m in momentum][:8]}... for "
                             f"variables of {[tuple(u.shape) for u in self.velocities][:8]}...")
        for group in self._groups:   # the exact groups' state claimed by none (take_owed does the lossy ones')
            if not group.lossy:
                group.aggregator.reset_rank_state()
        for u in self.velocities:
            u.assign(tf.zeros(u.shape, u.dtype))
        dropped = sum(1 for g in self._groups if not g.lossy for i in g.indices
                      if owed and owed[i] is not None and np.any(owed[i]))
        for group, per_bucket in per_group:
            for i in group.aggregator.take_owed(per_bucket):
                dropped += sum(1 for p in group.aggregator.buckets[i].positions
                               if owed and owed[group.indices[p]] is not None and np.any(owed[group.indices[p]]))
        if momentum and self.velocities:   # DGC's momentum: the variables' own shapes on any layout
            for u, value in zip(self.velocities, momentum):
                u.assign(value)
        rounds = self.auto_epochs.local if self.auto_epochs is not None else None
        if rounds is not None:
            dropped += rounds.load_rank_state(state.get("rounds") if state is not None else None)
        return dropped

    def auto_measurements(self):
        """With "auto" in the schedule: what it measured that holds on any layout (AutoEpochs.measurements,
        JSON values, alike on every rank); else None."""
        return self.auto_epochs.measurements() if self.auto_epochs is not None else None

    def load_auto_measurements(self, kept):
        """auto_measurements() of any layout, for the choices made on this one (nothing without "auto"),
        from the next set_epoch on (CompressionScheduler calls it as each epoch begins)."""
        if self.auto_epochs is not None and kept is not None:
            self.auto_epochs.load_measurements(kept)

    def sharded_full_state(self):
        """With shard_optimizer: the wrapped optimizer's state whole, gathered from the ranks' slices
        (ShardedUpdate.full_state, a collective); else None."""
        return self._sharded.full_state() if self._sharded is not None else None

    def load_sharded_full_state(self, state):
        """This rank's slices of sharded_full_state's ``state``, of any layout."""
        if self._sharded is None:
            raise ValueError("load_sharded_full_state needs shard_optimizer=True (built)")
        self._sharded.load_full_state(state)

    @property
    def variables(self):
        outer = self.auto_epochs.local_variables() if self.auto_epochs is not None else []
        return internals.optimizer_variables(self) + self.inner_optimizer.variables + outer

    def __setattr__(self, name, value):
        # a setattr hook, not a property: Keras' tracking skips a setter whose getter already
        # returns the value (None), which is what keras.optimizers.LossScaleOptimizer assigns
        if name == "loss_scale_factor":
            if value is not None:
                raise ValueError(f"loss_scale_factor is not supported by DistributedOptimizer (got {value!r}); "
                                 "wrap it in tf_commlib.keras.LossScaleOptimizer")
            if hasattr(self, "inner_optimizer"):   # a wrapper's (Optimizer.__init__ sets it before)
                super().__setattr__("_wrapped_by_loss_scale", True)
        super().__setattr__(name, value)

    # -- groups and bytes -------------------------------------------------------------------
    def sent_bytes_at(self, epoch):
        """{"intra": B, "inter": B} a step sends per rank at this epoch (the collectives' formulas)."""
        if self._sharded is not None:   # reduce-scatter + all-gather, and the norm exchange
            return self._sharded.sent_bytes(self.algorithm_at(epoch), self.density_at(epoch))
        if self.algorithm_at(epoch) == "diloco":   # auto's DiLoCo rounds
            return self.auto_epochs.local.sent_bytes()
        return link_bytes.add(*(g.aggregator.sent_bytes(self.algorithm_at(epoch), self.density_at(epoch))
                                if g.lossy else g.aggregator.sent_bytes() for g in self._groups))

    def sharded_state_bytes(self):
        """(this rank's, unsharded) bytes of the wrapped optimizer's state with shard_optimizer=True
        (after build); None without sharding."""
        if self._sharded is None:
            return None
        return self._sharded.state_bytes(), self._sharded.unsharded_state_bytes()

    def lossy_aggregators(self):
        """The aggregators of the variables a lossy collective may run (after build)."""
        return [g.aggregator for g in self._groups if g.lossy]

    def aggregators(self):
        """[(GradientAggregator, indices of the variables it aggregates)], in the order a step runs
        them (after build; the dense-layer group last): for profiling, e.g. twins with fresh state."""
        return [(g.aggregator, list(g.indices)) for g in self._groups]

    # -- the step --------------------------------------------------------------------------
    @plain_python
    def apply(self, grads, trainable_variables=None):
        if self._wrapped_by_loss_scale and not self._finite_checked_globally:
            raise ValueError("optimizer: this DistributedOptimizer is wrapped by a keras.optimizers."
                             "LossScaleOptimizer whose finite check is per rank (a rank that overflows would "
                             "skip the aggregation the others wait in); use tf_commlib.keras.LossScaleOptimizer, "
                             "or call tf_commlib.keras.global_loss_scale(model) after compile "
                             "(default_callbacks() does it in model.fit)")
        self._ensure_built(trainable_variables)
        update, commit = self.aggregate(grads)
        commit()
        self.apply_update(update, trainable_variables)
        if not self._count_deferred:
            self.count_step(trainable_variables or internals.trainable_variables(self))

    @plain_python
    def apply_update(self, update, trainable_variables=None):
        """The wrapped optimizer's step with aggregate()'s update (sharded: this rank's slices)."""
        if self._sharded is not None:
            return self._sharded.step(update)
        self.inner_optimizer.apply(update, trainable_variables or internals.trainable_variables(self))

    def measure(self, variables):
        """Before the build, where the schedule runs "auto": the link measured (cached per cluster) and the
        candidates timed at these variables' buckets (Measurements.calibrate). A collective: every rank
        calls it before its first step (apply does; CompressionScheduler when fit starts). Not part of
        build(): Keras builds a fresh copy of the optimizer on one thread of one rank (clone_model of a
        compiled model), where a collective would wait for ranks that never call it."""
        if not self.built and "auto" in self.schedule.values():
            with tf.init_scope():
                self.measurements.calibrate(self, variables)

    def _ensure_built(self, trainable_variables):
        if not self.built:
            self.measure(trainable_variables)
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True

    @plain_python
    def aggregate(self, grads):
        """(update, commit): the averaged update of every variable, and commit(), which writes what
        the step changes here (DGC momentum, the collectives' residuals, momentum masking). apply()
        commits at once; tf_commlib.keras.LossScaleOptimizer only when every rank's gradients were
        finite, so that the aggregation overlaps backprop and a skipped step changes nothing."""
        return step.aggregate(self, grads)

    def get_config(self):
        if self.dense_layers is not default_dense_layers:
            raise NotImplementedError("a DistributedOptimizer with a custom dense_layers predicate "
                                      "cannot be serialised; save weights instead")
        return {"name": self.name, "optimizer": keras.optimizers.serialize(self._given_optimizer()),
                "algorithm": self.algorithm, "density": self._density_arg, "compression": self.compression,
                **groups_to_config(self.dgc, self.schedule_options, self.auto, self.selection),
                "fusion_threshold_bytes": self.fusion_arg, "overlap": self.overlap,
                "shard_optimizer": self.shard_optimizer, "algorithm_options": self.algorithm_options}

    def _given_optimizer(self):
        """The wrapped optimizer as given: the stepping copy with DGC's momentum put back."""
        if self.inner_optimizer in WRAPPED or not self.dgc.momentum_correction:
            return self.inner_optimizer
        config = {**self.inner_optimizer.get_config(), "momentum": self.m, "nesterov": self.nesterov}
        return type(self.inner_optimizer).from_config(config)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = groups_from_config(grouped(config))
        optimizer = keras.optimizers.deserialize(config.pop("optimizer"), custom_objects=custom_objects)
        return cls(optimizer, **config)


WRAPPERS.append(DistributedOptimizer)
