"""Keras 3 distributed optimizer: sparse gradient aggregation with DGC's and RedSync's accuracy
techniques, for model.fit (jit_compile=False) and custom GradientTape loops.

Momentum correction (DGC eqs. 4 and 6): the momentum lives here, not in the wrapped optimizer.
Each step u <- m*u + g (local momentum), and u (Nesterov: m*u + g) is what gets aggregated; the
collective's error feedback accumulates it (v <- v + u) and sends the top entries of v. The
wrapped optimizer then takes a *plain* step with the averaged update. A wrapped
keras.optimizers.SGD, or an optimizer whose class sets ``movable_momentum = True`` (pto.LARS),
therefore has its momentum moved here (its own momentum is set to 0, so momentum is never applied
twice); any other wrapped optimizer needs ``momentum=`` and keeps its own adaptive rule on top of
the aggregated update.

Mixed precision (mixed_float16): loss scaling stays in a LossScaleOptimizer *around* the
DistributedOptimizer, so the gradients are unscaled before they reach DGC momentum and the residuals.
tf_commlib.keras.loss_scale.LossScaleOptimizer makes its finite check global (one 1-element allreduce per step):
every rank applies or skips a step together, so a step with an overflow on one rank is skipped
everywhere (loss scale halved on every rank) and never touches residuals or momentum.
``DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt))`` builds
``LossScaleOptimizer(DistributedOptimizer(opt))``; the keras.optimizers.LossScaleOptimizer that
Keras' compile puts around a DistributedOptimizer is made global by ``global_loss_scale(model)``
(CompressionScheduler, in default_callbacks(), calls it when fit starts).
"""
import dataclasses
import math

import keras
import tensorflow as tf

from tf_commlib import link_bytes, ops
from tf_commlib.aggregator import AutoSettings, ExecutionSettings, GradientAggregator, check_config, check_cost_params
from tf_commlib.keras.arguments import check_arguments, qrgc_options, take_momentum
from tf_commlib.keras.groups import Group
from tf_commlib.alphabeta import LinkParams
from tf_commlib.collectives import AUTO_MARGIN, check_margin, check_seconds, with_compression
from tf_commlib.collectives.interface import plain_python
from tf_commlib.fusion import DEFAULT_THRESHOLD_BYTES
from tf_commlib.overlap import after_all
from tf_commlib.keras.policy import EpochPolicy, check_candidates, default_dense_layers, parse_schedule
from tf_commlib.keras.sharded import ShardedUpdate, check_shardable
from tf_commlib.topology import topology as current_topology


def _zero_at(variable, flat_indices):
    """DGC's momentum factor masking: the variable set to 0 at these flat indices, in place."""
    ops.zero_at(variable.value if isinstance(variable, keras.Variable) else variable, flat_indices)


@keras.saving.register_keras_serializable(package="tf_commlib")
class DistributedOptimizer(EpochPolicy, keras.optimizers.Optimizer):
    """Wraps a Keras optimizer; gradients are averaged over all Horovod ranks before its step.

    Args:
      optimizer: the Keras 3 optimizer to wrap.
      algorithm, density, selector: the collective (tf_commlib.collectives), the fraction of
        entries sent, and the top-k selector (tf_commlib.ops.SELECTORS).
      momentum_correction, momentum, nesterov: DGC momentum correction (see the module doc).
      local_clip_norm: DGC local gradient clipping: each rank clips its gradient's global norm to
        local_clip_norm / sqrt(N) before accumulating.
      momentum_masking: DGC momentum factor masking: u is zeroed where v was sent. False keeps u, so
        the values sent add up to exactly the updates momentum SGD applies (later); where a
        coordinate is sent often, masking turns its momentum off. Measured (docs/benchmarks.md,
        bench tta, density 0.01, 8 epochs): off ends 2.5-3.3 points higher and reaches the target sooner.
      warmup: number of DGC warm-up epochs; density over them 0.25, 0.0625, 0.015625, 0.004
        (never below the target), then ``density``.
      dense_layers: predicate(variable) -> True for variables aggregated densely (RedSync
        policy); default: 1-D variables (biases, normalisation) and those under 1024 entries.
      schedule: {epoch: algorithm} switching the collective at epoch boundaries, e.g.
        {0: "hitopk", 13: "2dtar"} (shi2021's DAWNBench recipe).
      dense_warmup_epochs: RedSync's dense warm-up: the first epochs use "2dtar".
      qrgc: RedSync's quantized selection (selector "qrgc", one tensor per bucket) for every
        sparse variable except the output layer (the last one), which keeps ``selector``; its
        messages carry one mean per rank (value_codec "mean", exact for qRGC's equal values) in
        every algorithm that takes that codec, unless algorithm_options sets value_codec.
      density="adaptive": tyagi's adaptive compression ratio over ``candidates`` (default
        (0.1, 0.033, 0.011, 0.004, 0.001)), driven by the callback tf_commlib.keras.AdaptiveDensity
        (which profiles them and sets the density); until then the first candidate.
      overlap: False makes aggregation wait for the whole of backprop (the fp32 baseline of
        tf_commlib's benchmarks); default True (below).
      cost_params: tf_commlib.alphabeta.LinkParams by which algorithm "auto" chooses per bucket
        (e.g. tf_commlib.costmodel.calibrate(topology) on the running cluster); default LinkParams().
      auto_margin: "auto" picks a sparse collective for a bucket only where its predicted time is at
        most auto_margin x the fastest exact one's (default 0.5; 1.0: the plain minimum).
      auto_compute_s: seconds of forward+backward per step, which overlapped aggregation runs beside
        (e.g. tf_commlib.costmodel.compute_seconds(topo, model, x, y, loss)): "auto" keeps every
        bucket exact unless its choice makes the predicted step, max(compute, communication), at most
        auto_margin x the all-exact one. None (default): not considered.
      fusion_threshold_bytes, seed, algorithm_options, compression: passed to the GradientAggregators
        (algorithm_options = {algorithm: {option: value}}, see tf_commlib.collectives; compression
        "fp16" or "bf16" sends 16-bit values in dense and 2dtar, the dense-layer group included).
      shard_optimizer: True shards the wrapped optimizer's update and state over the ranks (ZeRO-1,
        tf_commlib.keras.sharded): over all P ranks with one dense / 2dtar algorithm, else (sparse
        collectives, auto, schedules) over the ranks of a node; SGD, Adam(W), pto.LARS, pto.LAMB.
    Inside model.fit each bucket is aggregated as soon as its gradients exist, while backprop goes
    on (tf_commlib.overlap; buckets are packed from the last layer). Setting ``timeline`` to a
    tf_commlib.overlap.Timeline before the first step records when each gradient reaches apply() and
    when each bucket's aggregation starts.
    The epoch-driven parts (warm-up, schedule) are driven by ``set_epoch``, which the callback
    tf_commlib.keras.CompressionScheduler calls from model.fit.

    A keras.optimizers.LossScaleOptimizer as ``optimizer`` is moved outside: the result is
    LossScaleOptimizer(DistributedOptimizer(its inner optimizer)) with its initial_scale and
    dynamic_growth_steps (this module's LossScaleOptimizer, whose finite check is global).
    """

    # tf_commlib.keras.loss_scale.LossScaleOptimizer, set by that module (tf_commlib.keras imports it)
    loss_scale_class = None

    def __new__(cls, optimizer=None, *args, **kwargs):
        if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return super().__new__(cls)
        if optimizer.built:
            raise ValueError("optimizer is a LossScaleOptimizer that has already been built (it has taken "
                             "steps); wrap a new one")
        return cls.loss_scale_class(cls(optimizer.inner_optimizer, *args, **kwargs), name=optimizer.name,
                                    initial_scale=optimizer.initial_scale,
                                    dynamic_growth_steps=optimizer.dynamic_growth_steps)

    def __init__(self, optimizer, algorithm="hitopk", density=0.01, selector="mstopk",
                 momentum_correction=True, momentum=None, nesterov=False, local_clip_norm=None,
                 momentum_masking=True, warmup=None, dense_layers=None, schedule=None,
                 dense_warmup_epochs=0, qrgc=False, fusion_threshold_bytes=DEFAULT_THRESHOLD_BYTES,
                 seed=None,
                 name=None, algorithm_options=None, candidates=None, compression="none", overlap=True,
                 cost_params=None, shard_optimizer=False, auto_margin=AUTO_MARGIN, auto_compute_s=None):
        candidates, is_adaptive = check_candidates(density, candidates), density == "adaptive"
        density = candidates[0] if is_adaptive else density
        check_config(algorithm, density, selector, algorithm_options=algorithm_options)
        with_compression(algorithm_options, compression)   # ValueError naming a bad compression
        if isinstance(optimizer, DistributedOptimizer):
            raise ValueError(f"optimizer must be a Keras 3 optimizer (not a DistributedOptimizer), got {optimizer!r}")
        check_arguments(optimizer, momentum_correction, momentum, nesterov, local_clip_norm,
                        momentum_masking, warmup, dense_layers, dense_warmup_epochs, qrgc,
                        fusion_threshold_bytes, seed, name, overlap, shard_optimizer)
        check_cost_params(cost_params)
        auto_margin = check_margin(auto_margin, "auto_margin")
        auto_compute_s = check_seconds(auto_compute_s, "auto_compute_s")
        schedule = parse_schedule(schedule, algorithm, dense_warmup_epochs)
        if shard_optimizer:
            check_shardable(optimizer)
        m, nesterov = take_momentum(optimizer, momentum_correction, momentum, nesterov)
        super().__init__(learning_rate=0.0, name=name or "distributed_" + optimizer.name)
        self.schedule, self.m = schedule, m
        self.inner_optimizer = optimizer
        optimizer._tf_commlib_wrapped = True   # its momentum (SGD) and its state now live here
        self.algorithm, self.target_density, self.selector = algorithm, float(density), selector
        self.momentum_correction, self.nesterov = momentum_correction, bool(nesterov)
        self.momentum_masking, self.local_clip_norm = momentum_masking, local_clip_norm
        self.warmup = warmup or 0
        self.dense_layers = dense_layers or default_dense_layers
        self.fusion_threshold_bytes, self.seed, self.qrgc = fusion_threshold_bytes, seed, qrgc
        self.algorithm_options, self.compression = algorithm_options, compression
        self.candidates, self.adaptive = candidates, is_adaptive
        self.overlap, self.cost_params, self.shard_optimizer = overlap, cost_params, shard_optimizer
        self.auto_margin, self.auto_compute_s = auto_margin, auto_compute_s
        self._sharded = None

    # -- state -----------------------------------------------------------------------------
    timeline = None   # a tf_commlib.overlap.Timeline (set before the first step), or None

    def _factory(self, shape, dtype, name):
        return self.add_variable(shape=shape, dtype=tf.as_dtype(dtype).name, initializer="zeros",
                                 name=name, aggregation="none")

    def build(self, var_list):
        if self.built:
            return
        topo = current_topology()
        dense_idx = [i for i, v in enumerate(var_list) if self.dense_layers(v)]
        sparse_idx = [i for i, v in enumerate(var_list) if not self.dense_layers(v)]
        names = sorted(set(self.schedule.values()), key=list(self.schedule.values()).index)

        def aggregator(algorithm, selector, fusion, options=self.algorithm_options):
            return GradientAggregator(algorithm, self.target_density, selector, topology=topo,
                                      fusion_threshold_bytes=fusion, seed=self.seed,
                                      algorithm_options=with_compression(options, self.compression),
                                      # without overlap nothing hides under backprop
                                      auto=AutoSettings(self.cost_params, self.auto_margin,
                                                        self.auto_compute_s if self.overlap else None),
                                      execution=ExecutionSettings(track_gain=self.adaptive, timeline=self.timeline,
                                                                  variable_factory=self._factory))

        self._groups = []
        if self.qrgc and len(sparse_idx) > 1:
            self._groups.append(Group(aggregator(names, "qrgc", 0, qrgc_options(self.algorithm_options)),
                                      sparse_idx[:-1], True))
            sparse_idx = sparse_idx[-1:]
        self._groups.append(Group(aggregator(names, self.selector, self.fusion_threshold_bytes), sparse_idx, True))
        self._groups.append(Group(aggregator(["2dtar" if topo.m > 1 and topo.n > 1 else "dense"],
                                             self.selector, self.fusion_threshold_bytes), dense_idx, False))
        self._groups = [g for g in self._groups if g.indices]
        for tag, group in enumerate(self._groups):
            group.aggregator.timeline_tag = tag
        for group in self._groups:
            group.aggregator.build([(var_list[i].shape, var_list[i].dtype) for i in group.indices])
        self.velocities = [self.add_variable_from_reference(v, "dgc_momentum")
                           for v in var_list] if self.momentum_correction else []
        if self.shard_optimizer:   # the inner optimizer's state only for this rank's slices
            self._sharded = ShardedUpdate(self, var_list, self._groups)
        else:
            self.inner_optimizer.build(var_list)
        super().build(var_list)
        self._apply_epoch(self._epoch)

    def reset_rank_state(self):
        """Zeroes the per-rank state (residuals, DGC momentum), e.g. after loading weights that one
        rank saved for all (the consistency check refuses another rank's state otherwise)."""
        if not self.built:
            return
        for group in self._groups:
            group.aggregator.reset_rank_state()
        for u in self.velocities:
            u.assign(tf.zeros(u.shape, u.dtype))
        if self._sharded is not None:   # the rank's slices of the optimizer state
            self._sharded.reset()

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self.inner_optimizer.learning_rate = value

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    # keras.optimizers.LossScaleOptimizer sets its inner optimizer's loss_scale_factor to None: the
    # one sign that a LossScaleOptimizer wraps this one (apply() refuses one whose check is per rank)
    _wrapped_by_loss_scale = _finite_checked_globally = False

    def __setattr__(self, name, value):
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
        return link_bytes.add(*(g.aggregator.sent_bytes(self.algorithm_at(epoch), self.density_at(epoch))
                                if g.lossy else g.aggregator.sent_bytes() for g in self._groups))

    def sharded_state_bytes(self):
        """(this rank's, unsharded) bytes of the wrapped optimizer's state with shard_optimizer=True
        (after build); None without sharding."""
        if self._sharded is None:
            return None
        return self._sharded.state_bytes(), self._sharded.unsharded_state_bytes()

    def sparse_aggregators(self):
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

    @plain_python
    def apply_update(self, update, trainable_variables=None):
        """The wrapped optimizer's step with aggregate()'s update (sharded: this rank's slices)."""
        if self._sharded is not None:
            return self._sharded.step(update)
        self.inner_optimizer.apply(update, trainable_variables or self._trainable_variables)

    def _ensure_built(self, trainable_variables):
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True

    @plain_python
    def aggregate(self, grads):
        """(update, commit): the averaged update of every variable, and commit(), which writes what
        the step changes here (DGC momentum, the collectives' residuals, momentum masking). apply()
        commits at once; tf_commlib.keras.LossScaleOptimizer only when every rank's gradients were
        finite, so that the aggregation overlaps backprop and a skipped step changes nothing."""
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        if self.timeline is not None:
            grads = [self.timeline.stamp(("gradient", i), g) for i, g in enumerate(grads)]
        if not self.overlap:   # every group and bucket waits for the whole of backprop
            grads = after_all(grads)
        if self.local_clip_norm:
            present = [g for g in grads if g is not None]
            clipped, _ = tf.clip_by_global_norm(
                present, self.local_clip_norm / math.sqrt(current_topology().size))
            it = iter(clipped)
            grads = [None if g is None else next(it) for g in grads]
        send, velocities = list(grads), {}
        if self.momentum_correction:
            for i, g in enumerate(grads):
                if g is not None:
                    velocities[i] = self.m * tf.convert_to_tensor(self.velocities[i]) + g
                    send[i] = self.m * velocities[i] + g if self.nesterov else velocities[i]
        if self._sharded is not None:   # update: this rank's slice of every bucket
            update, reduced, sent = self._sharded.reduce_scatter(send)

            def commit():
                for i, u in velocities.items():
                    self.velocities[i].assign(u)
                reduced()
                if self.momentum_correction and self.momentum_masking:
                    for i, where in sent.items():
                        _zero_at(self.velocities[i], where)
            return update, commit
        update, commits, masked = list(send), [], []
        for group in self._groups:
            aggregated, sent, commit = group.aggregator.aggregate_deferred(
                [send[i] for i in group.indices], step=self.iterations, sent="indices")
            commits.append(commit)
            for i, g, where in zip(group.indices, aggregated, sent):
                update[i] = g
                if group.lossy and where is not None and self.momentum_correction and self.momentum_masking:
                    masked.append((i, where))

        def commit():
            for i, u in velocities.items():
                self.velocities[i].assign(u)
            for c in commits:
                c()
            for i, where in masked:
                _zero_at(self.velocities[i], where)

        return update, commit

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    def get_config(self):
        if self.dense_layers is not default_dense_layers:
            raise NotImplementedError("a DistributedOptimizer with a custom dense_layers predicate "
                                      "cannot be serialised; save weights instead")
        return {"name": self.name, "optimizer": keras.optimizers.serialize(self.inner_optimizer),
                "algorithm": self.algorithm, "density": "adaptive" if self.adaptive else self.target_density,
                "candidates": list(self.candidates) if self.adaptive else None,
                "selector": self.selector, "momentum_correction": self.momentum_correction,
                "momentum": self.m if self.momentum_correction else None, "nesterov": self.nesterov,
                "local_clip_norm": self.local_clip_norm, "momentum_masking": self.momentum_masking,
                "warmup": self.warmup, "schedule": {str(e): a for e, a in self.schedule.items()},
                "qrgc": self.qrgc, "fusion_threshold_bytes": self.fusion_threshold_bytes,
                "seed": self.seed, "algorithm_options": self.algorithm_options, "compression": self.compression,
                "overlap": self.overlap, "shard_optimizer": self.shard_optimizer, "auto_margin": self.auto_margin,
                "auto_compute_s": self.auto_compute_s,
                "cost_params": None if self.cost_params is None else dataclasses.asdict(self.cost_params)}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["optimizer"] = keras.optimizers.deserialize(config["optimizer"],
                                                           custom_objects=custom_objects)
        config["schedule"] = {int(e): a for e, a in config["schedule"].items()}
        config.setdefault("auto_margin", 1.0)   # saved before auto_margin existed: "auto" was the plain argmin
        if config.get("cost_params") is not None:
            params = dict(config["cost_params"])
            params["compute_curve"] = tuple(tuple(row) for row in params.get("compute_curve", ()))
            config["cost_params"] = LinkParams(**params)
        return cls(**config)


def distributed_optimizer(model_or_optimizer):
    """The DistributedOptimizer of a Keras model (its ``optimizer``) or of an optimizer, found through
    wrappers' ``inner_optimizer`` (e.g. the LossScaleOptimizer that compile adds under mixed_float16)."""
    opt = model_or_optimizer.optimizer if isinstance(model_or_optimizer, keras.Model) else model_or_optimizer
    while not isinstance(opt, DistributedOptimizer):
        if not isinstance(opt, keras.optimizers.Optimizer) or not hasattr(opt, "inner_optimizer"):
            raise ValueError(f"model_or_optimizer has no DistributedOptimizer: {model_or_optimizer!r}")
        opt = opt.inner_optimizer
    return opt
