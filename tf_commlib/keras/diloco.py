"""DiLoCo for Keras 3: hierarchical local SGD with an outer optimizer (Douillard et al. 2023; Lin et al.'s
hierarchical local SGD). For links between nodes too slow for per-step compression.

* Every step, inside a node: the gradients are averaged over the node's ranks (one reduce-scatter and
  one all-gather: shared memory on CPU, Horovod/NCCL on GPU; a node of one rank skips it) and the
  inner optimizer steps. The ranks of a node hold the same weights; nodes drift apart.
* Every ``sync_every`` steps, across nodes: each node's pseudo-gradient (the start weights minus its
  weights) is averaged between nodes. The node's ranks split it: rank l of a node sends slice l over
  its inter-node set (the n inter-node sets run at once), in ``inter_compression``'s codec, with error
  feedback for a lossy one. The outer optimizer (default SGD lr 0.7, momentum 0.9, Nesterov) applies
  the mean as its gradient to the start weights, identically on every rank, and every rank goes on
  from the result. Float non-trainable variables (batch-norm statistics) are averaged at each sync.
* ``overlap=True``: the inter-node exchange of sync t runs on a background thread while the next
  interval's inner steps go on, and its outer update is applied at sync t+1 (one interval late, as in
  the eager/streaming variants): each node then continues from the new start weights plus its own
  progress of the last interval. The link is hidden unless it takes longer than ``sync_every`` steps.
* ``sync_every="auto"``: H chosen at each ``synchronize()`` from the measured step, exchange and sync-work
  times, the same on every rank (tf_commlib.auto.interval); AUTO_START before the first choice.
* At each epoch end (``synchronize()``, which the callback NodeSync in
  ``default_callbacks()`` calls) a pending exchange is applied and the steps since the last sync are
  synchronised without overlap: evaluation, checkpoints and the end of training see weights that are
  the same on every rank. BackupAndRestore keeps the start weights, the outer optimizer's state, the
  residuals and the step count (the optimizer's variables).

The optimizer's own step counts the inner steps and runs the sync every H of them (a tf.py_function at
the end of a traced step): model.fit with or without callbacks, steps_per_execution > 1 and a custom loop
of ``apply_gradients`` sync alike. tf_commlib.keras.LossScaleOptimizer counts a step it skips too, so
nodes never disagree on when to sync. The end of model.fit synchronises (finalize_variable_values); a
custom loop calls ``synchronize()`` at its end, where its step count is not a multiple of H. Without
NodeSync nothing passes the model's batch-norm statistics (``track_statistics``): they stay
per node. Under mixed_float16 the finite check of
tf_commlib.keras.LossScaleOptimizer is node-wide: the ranks of a node skip a step together, and no
traffic leaves the node between syncs; a non-finite mean pseudo-gradient is skipped by every rank.

This file is the Keras optimizer (arguments, state, the inner step, when to sync);
tf_commlib.diloco_sync is the sync itself (send, exchange, outer step, restart).
"""
import time

import keras
import numpy as np
import tensorflow as tf

from tf_commlib import internals, primitives
from tf_commlib.collectives import codec as codecs
from tf_commlib.collectives.interface import plain_python
from tf_commlib.inter_mean import Exchanges
from tf_commlib.diloco_sync import Syncs, node_average
from tf_commlib.auto.interval import (AUTO_INTERVALS, AUTO_START, EXPOSED, HIDDEN, SYNC_WORK,  # noqa: F401
                                       Window, choose_interval, measured_times)
from tf_commlib.keras.optimizer import DistributedOptimizer
from tf_commlib.keras.wrapping import WRAPPERS, InnerSteps
from tf_commlib.topology import topology as current_topology


def _codec(name):
    """The codec of inter_compression (None: float32): one whose error stays below the value (error
    feedback, which resends what a sync's rounding left, grows without bound otherwise); ValueError
    naming the argument otherwise."""
    accepted = sorted(c for c, codec in codecs.REGISTRY.items() if codec.error_bound < 1)
    if name is None:
        return codecs.get("none")
    if isinstance(name, str) and name in codecs.REGISTRY and name not in accepted:
        bound = codecs.get(name).error_bound
        raise ValueError(f"inter_compression {name!r}: its error is not bounded below the value it sends "
                         f"(E||error||^2 up to {bound:.3g} x ||x||^2), so the error feedback of the "
                         f"pseudo-gradients would grow without bound; give None or one of {accepted} "
                         "(e.g. 'int4' for 4 bits)")
    if not isinstance(name, str) or name not in accepted:
        raise ValueError(f"inter_compression must be None or one of {accepted}, got {name!r}")
    return codecs.get(name)


def _check(inner_optimizer, sync_every, outer_optimizer, overlap):
    if isinstance(inner_optimizer, (DistributedOptimizer, DiLoCo)) or \
            isinstance(inner_optimizer, keras.optimizers.LossScaleOptimizer) or \
            not isinstance(inner_optimizer, keras.optimizers.Optimizer):
        raise ValueError("inner_optimizer must be a plain Keras 3 optimizer (not a DistributedOptimizer, DiLoCo or "
                         f"LossScaleOptimizer: DiLoCo averages inside the node itself), got {inner_optimizer!r}")
    if sync_every != "auto" and (isinstance(sync_every, bool) or not isinstance(sync_every, (int, np.integer))
                                 or sync_every < 1):
        raise ValueError(f"sync_every must be an int >= 1 (inner steps between syncs) or 'auto', got {sync_every!r}")
    if outer_optimizer is not None and (
            not isinstance(outer_optimizer, keras.optimizers.Optimizer) or outer_optimizer is inner_optimizer
            or isinstance(outer_optimizer, (DistributedOptimizer, DiLoCo, keras.optimizers.LossScaleOptimizer))):
        raise ValueError("outer_optimizer must be None (SGD lr 0.7, momentum 0.9, Nesterov) or another plain Keras 3 "
                         f"optimizer than inner_optimizer, got {outer_optimizer!r}")
    for arg, opt in (("inner_optimizer", inner_optimizer), ("outer_optimizer", outer_optimizer)):
        if opt is not None and opt.built:
            raise ValueError(f"{arg} is already built (it has stepped); give a new instance")
    if getattr(inner_optimizer, "use_ema", False):
        raise ValueError("inner_optimizer: use_ema=True would end training with each node's own average; give "
                         "use_ema=False")
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap must be True or False, got {overlap!r}")


@keras.saving.register_keras_serializable(package="tf_commlib")
class DiLoCo(InnerSteps, Syncs, keras.optimizers.Optimizer):
    """Local SGD inside nodes, an outer optimizer across them every ``sync_every`` steps (module doc).

    Args:
      inner_optimizer: the Keras 3 optimizer of the inner steps (e.g. AdamW, SGD with momentum).
      sync_every: inner steps between syncs across nodes (H), or "auto": chosen at each epoch end from
        the measured step and exchange times (choose_interval; AUTO_START before).
      outer_optimizer: the Keras 3 optimizer that applies the mean pseudo-gradient to the start
        weights; default SGD(learning_rate=0.7, momentum=0.9, nesterov=True).
      inter_compression: None (float32) or a codec of tf_commlib.collectives.codec for the
        pseudo-gradient between nodes: "fp16", "bf16", "int8" and "int4" (8 or 4 bits, per 1024 values
        the largest magnitude as scale, rounded to the nearest level), "qsgd8" (8 bits, the L2 norm,
        stochastic rounding); a lossy one keeps what it did not send in a residual (error feedback),
        so a codec whose error can exceed its value (qsgd4, qsgd2) is refused.
      overlap: the exchange runs while the next interval's inner steps go on (its update applied at
        the next sync); False waits for it.
    """
    state_differs_by_node = True   # BroadcastGlobalVariables leaves its state alone

    def __init__(self, inner_optimizer, sync_every, outer_optimizer=None, inter_compression=None, overlap=True,
                 *, name=None):
        _check(inner_optimizer, sync_every, outer_optimizer, overlap)
        wire = _codec(inter_compression)
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name must be None or a string, got {name!r}")
        super().__init__(learning_rate=0.0, name=name or "diloco_" + inner_optimizer.name)
        self.inner_optimizer = inner_optimizer
        self.outer_optimizer = outer_optimizer or keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
        self.auto_interval = sync_every == "auto"
        self.sync_every = AUTO_START if self.auto_interval else int(sync_every)
        self.inter_compression, self.overlap = inter_compression, overlap
        self.intervals = {}      # epoch -> the H it started with (set_epoch)
        self.interval_log = []   # sync_every="auto": one dict per decision (the measurements and the H chosen)
        self._window, self._last_end = Window(self.auto_interval), None
        self.wire = wire
        self.timeline = None   # a list: (event, index, perf_counter seconds) appended when set
        self._statistics, self._exchanges, self._pending = [], Exchanges(), None


    def __setattr__(self, name, value):
        # plain Python objects: Keras' tracking would copy a list or dict, and take the model's variables
        # in _tracked and _statistics for the optimizer's own
        if name in ("timeline", "_pending", "_tracked", "_statistics", "intervals", "interval_log", "_window"):
            object.__setattr__(self, name, value)
        elif name == "loss_scale_factor":   # as DistributedOptimizer: the sign of a LossScaleOptimizer around it
            if value is not None:
                raise ValueError(f"loss_scale_factor is not supported by DiLoCo (got {value!r}); wrap it in "
                                 "tf_commlib.keras.LossScaleOptimizer")
            if hasattr(self, "inner_optimizer"):
                object.__setattr__(self, "_wrapped_by_loss_scale", True)
            super().__setattr__(name, value)
        else:
            super().__setattr__(name, value)

    # -- what other parts of tf_commlib ask of the optimizer of a model ------------------------
    def finite_check(self, overflowed):
        """Whether any rank of this node overflowed (the LossScaleOptimizer's check: node-wide)."""
        topo = current_topology()
        every = primitives.allgather(tf.reshape(overflowed, [1]), topo.intra)
        return tf.equal(tf.reduce_sum(every), 0.0)

    def set_epoch(self, epoch):
        """Notes the H this epoch starts with (the callbacks call it at each epoch's start)."""
        self.intervals[epoch] = self._current_interval()

    def interval_at(self, epoch):
        """The H an epoch started with (the current one for an epoch not started yet)."""
        return self.intervals.get(epoch, self._current_interval())

    def algorithm_at(self, epoch):
        return f"diloco_h{self.interval_at(epoch)}"

    def density_at(self, epoch):
        return 1.0

    def track_statistics(self, variables):
        """Averages these float non-trainable variables (e.g. batch-norm statistics) at each sync;
        before the first step (NodeSync passes the model's)."""
        if self.built:
            raise ValueError("track_statistics: the optimizer has already stepped; call it before the first step")
        self._statistics = [v for v in variables if tf.as_dtype(v.dtype).is_floating and not v.trainable]

    # -- state -------------------------------------------------------------------------------
    @property
    def variables(self):
        return internals.optimizer_variables(self) + self.inner_optimizer.variables + self.outer_optimizer.variables

    def build(self, var_list):
        if self.built:
            return
        self._build_syncs(self, var_list, self._statistics)
        # sync_every="auto": the H chosen (a fixed H's optimizer keeps the variables it always had)
        self.interval = self.add_variable((), dtype="int64", initializer="zeros", name="diloco_interval") \
            if self.auto_interval else None
        if self.interval is not None:
            with tf.init_scope():
                self.interval.assign(self.sync_every)
        self.inner_optimizer.build(var_list)
        super().build(var_list)

    # -- the inner step -------------------------------------------------------------------------
    @plain_python
    def apply(self, grads, trainable_variables=None):
        if not tf.executing_eagerly() and internals.in_xla_context():
            raise ValueError("DiLoCo cannot run in a step compiled with XLA (jit_compile=True); compile with "
                             "jit_compile=False")
        if self._wrapped_by_loss_scale and not self._finite_checked_globally:
            raise ValueError("optimizer: this DiLoCo is wrapped by a keras.optimizers.LossScaleOptimizer whose finite "
                             "check is per rank (a rank that overflows would skip the node exchange its partners wait "
                             "in); use tf_commlib.keras.LossScaleOptimizer, or default_callbacks() in model.fit")
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        tvs = trainable_variables or internals.trainable_variables(self)
        self.inner_optimizer.apply(node_average(grads, tvs), tvs)
        if not self._count_deferred:
            self.count_step(tvs)

    def end_step(self):
        """Nothing: the step counts itself (count_step). Kept so that a loop that calls it after each
        step runs unchanged."""

    def finalize_variable_values(self, var_list):
        """The end of model.fit: synchronize(), so that every rank ends with the same weights."""
        super().finalize_variable_values(var_list)
        self.synchronize()

    def _counts_steps(self):
        return True

    def _step_done(self):
        """Counts one inner step; syncs across nodes every sync_every steps (on every rank: every rank
        counts every step, a loss-scaled skipped one included)."""
        if not self.built:
            return
        now = time.perf_counter()
        if self._last_end is not None:
            self._window.add("steps", now - self._last_end)
        steps = int(self.steps_done.assign_add(1).numpy())
        if self.timeline is not None:
            self.timeline.append(("step_end", steps, now))
        h = self._current_interval()
        if steps % h == 0:   # the index seeds the codec's rounding: for "auto" (H changes) the step
            self._timed(self._sync_overlapped if self.overlap else self._sync_now,
                        steps if self.auto_interval else steps // h)
            self.synced_at.assign(steps)
        self._last_end = time.perf_counter()

    def _current_interval(self):
        """H: given, or for "auto" the variable's (restored by BackupAndRestore) once built."""
        if self.built and self.interval is not None:
            self.sync_every = int(self.interval.numpy())
        return self.sync_every

    def synchronize(self):
        """Makes every rank hold the same weights: applies a pending exchange, then syncs the steps since
        the last sync without overlap (NodeSync calls it at each epoch end, and the end of model.fit). A
        collective."""
        if not self.built:
            return
        self._flush()
        steps = int(self.steps_done.numpy())
        if steps > int(self.synced_at.numpy()):
            self._timed(self._sync_now, -steps)   # a negative index: no interval's seed
            self.synced_at.assign(steps)
        if self.auto_interval:
            self._choose_interval()
        self._last_end = None   # what comes before the next step (evaluation, the epoch's end) is no step

    def _choose_interval(self):
        """sync_every="auto": H from the window's measurements of every rank (interval.measured_times)."""
        w, self._window = self._window, Window(True)
        times = measured_times(w)
        if times is None:
            return
        h = choose_interval(*times, self.overlap)
        self.interval.assign(h)
        self.sync_every = h
        exchange_s, sync_s, step_s = times
        self.interval_log.append({"steps": int(self.steps_done.numpy()), "exchange_s": exchange_s, "sync_s": sync_s,
                                  "step_s": step_s, "sync_every": h})

    # -- bytes -----------------------------------------------------------------------------------
    def interval_bytes(self, h=None):
        """{"intra": B, "inter": B} this rank sends in h (default: the current H) inner steps and one sync
        (after build)."""
        return self._bytes_of_interval(self._current_interval() if h is None else h)

    def sent_bytes_at(self, epoch):
        """{"intra": B, "inter": B} per step, averaged over an interval (after build)."""
        h = self.interval_at(epoch)
        return {k: v / h for k, v in self.interval_bytes(h).items()}

    def get_config(self):
        return {"name": self.name, "inner_optimizer": keras.optimizers.serialize(self.inner_optimizer),
                "sync_every": "auto" if self.auto_interval else self.sync_every,
                "outer_optimizer": keras.optimizers.serialize(self.outer_optimizer),
                "inter_compression": self.inter_compression, "overlap": self.overlap}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.optimizers.deserialize(config.pop("inner_optimizer"), custom_objects=custom_objects)
        outer = keras.optimizers.deserialize(config.pop("outer_optimizer"), custom_objects=custom_objects)
        return cls(inner, outer_optimizer=outer, **config)


WRAPPERS.append(DiLoCo)
