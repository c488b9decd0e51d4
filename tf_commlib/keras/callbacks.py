"""Keras callbacks like Horovod's, for the Keras 3 DistributedOptimizer."""
import json
import time
import os
import shutil

import keras
import numpy as np
import tensorflow as tf

from tf_commlib import internals, primitives
from tf_commlib.replicas import average_variables, broadcast_variables  # noqa: F401 (re-exported)
from tf_commlib.keras.loss_scale import global_loss_scale
from tf_commlib.keras.diloco import DiLoCo
from tf_commlib.keras.optimizer import DistributedOptimizer, distributed_optimizer
from tf_commlib.topology import topology as current_topology


class BroadcastGlobalVariables(keras.callbacks.Callback):
    """Broadcasts the model's variables from root_rank at the start of training, and the wrapped
    optimizer's (created at the first step) after the first batch, each dtype only where some rank
    holds other values (broadcast_variables). DistributedOptimizer's own
    state (residuals, DGC momentum) is per rank by design and is not broadcast (nor is a
    LossScaleOptimizer's loss scale, equal on every rank by its global finite check). Once per
    instance: a loop that calls model.fit once per epoch with the same callbacks broadcasts once,
    not every epoch (ranks that trained together hold the same weights; ResNet-50's 100 MB each
    epoch cost 8 s at 100 Mbit/s)."""

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank = root_rank
        self._model_done = self._optimizer_done = False

    def on_train_begin(self, logs=None):
        if not self._model_done:
            broadcast_variables(self.model.variables, self.root_rank)
            self._model_done = True

    def on_train_batch_end(self, batch, logs=None):
        if not self._optimizer_done:
            opt = self.model.optimizer
            try:
                opt = distributed_optimizer(opt)
                # DiLoCo's nodes have stepped apart already; its start weights are the broadcast model's
                opt = None if getattr(opt, "state_differs_by_node", False) else opt.inner_optimizer
            except ValueError:   # no DistributedOptimizer: all of the optimizer's state
                pass
            if opt is not None:
                broadcast_variables(opt.variables, self.root_rank)
            self._optimizer_done = True


class MetricAverage(keras.callbacks.Callback):
    """Averages the epoch's metrics over all ranks (put it before callbacks that read them)."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        world = current_topology().world
        keys = sorted(k for k, v in logs.items() if isinstance(v, (int, float, np.floating)))
        values = primitives.allreduce(tf.constant([float(logs[k]) for k in keys], tf.float64), world,
                             average=True).numpy()
        logs.update(dict(zip(keys, values.tolist())))


class CompileGuard(keras.callbacks.Callback):
    """Makes a compiled model safe for the collectives before the first step, on every rank: refuses
    XLA (jit_compile=True, also what Keras' default "auto" means on a GPU: the collectives have no XLA
    kernels), and makes the finite check of the LossScaleOptimizer that compile adds under
    mixed_float16 global (global_loss_scale: a rank that overflowed would skip a collective the others
    wait in)."""

    def on_train_begin(self, logs=None):
        if getattr(self.model, "jit_compile", False) is True:
            raise ValueError("model.compile(jit_compile=True): DistributedOptimizer's collectives (Horovod's and "
                             "tf_commlib's ops) have no XLA kernels; compile with jit_compile=False (on a GPU, "
                             "Keras' default jit_compile='auto' turns XLA on)")
        global_loss_scale(self.model)


class NodeSync(keras.callbacks.Callback):
    """Every rank holds the same weights where model.fit looks at them: at each epoch's end and before
    validation, the sync of a DiLoCo or of auto's "diloco" rounds (their steps sync every H steps by
    themselves; the end of fit syncs too). A DiLoCo also gets the model's float non-trainable variables
    (batch-norm statistics) to average at its syncs."""

    def on_train_begin(self, logs=None):
        opt = _of_kind(self.model, DiLoCo)
        if opt is not None and not opt.built:
            opt.track_statistics(self.model.non_trainable_variables)

    def on_epoch_end(self, epoch, logs=None):
        _synchronize(self.model)

    def on_test_begin(self, logs=None):   # fit's validation runs before on_epoch_end
        _synchronize(self.model)


class CompressionScheduler(keras.callbacks.Callback):
    """Drives DistributedOptimizer's epochs from model.fit: the density warm-up and the collective
    schedule (set_epoch), and for algorithm="auto" the epochs the fit runs, each batch timed and each
    epoch's median step handed to the optimizer, which chooses the next epoch's collective (the step
    is traced again when it changed). The steps count themselves (the optimizers' count_step): no
    result depends on this callback, only auto's choices after the first epoch."""

    def on_train_begin(self, logs=None):
        dist = _distributed_or_none(self.model)
        if dist is not None:   # "auto" weighs a candidate over the epochs this fit runs
            dist.set_fit_epochs(self.params.get("epochs"), self.params.get("steps"))
            dist.measure(self.model.trainable_variables)   # "auto": before on_epoch_begin builds it

    def on_epoch_begin(self, epoch, logs=None):
        opt = distributed_optimizer(self.model)
        opt.set_epoch(epoch)
        top = self.model.optimizer
        if not top.built:   # eagerly: a first step that creates variables is traced twice by tf.function
            with keras.name_scope(top.name, caller=top):
                top.build(self.model.trainable_variables)
        if isinstance(opt, DistributedOptimizer) and opt.stale_trace():   # "auto" switched collective
            self.model.make_train_function(force=True)
        # the first epoch with a new train function traces the step (what "auto" weighs a change by);
        # kept on the optimizer: a later fit with new callbacks reuses the model's train function
        self._traced = opt.new_trace(self.model.train_function) if isinstance(opt, DistributedOptimizer) else False
        self._step_seconds, self._batch_start = [], None

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if getattr(self, "_batch_start", None) is not None:
            self._step_seconds.append(time.perf_counter() - self._batch_start)

    def on_epoch_end(self, epoch, logs=None):
        opt = _distributed_or_none(self.model)
        calls = getattr(self, "_step_seconds", None)   # one per batch callback: steps_per_execution steps
        if opt is not None and calls:   # "auto" learns from the epoch's steps, and what a new trace cost
            per_call = int(getattr(self.model, "steps_per_execution", 1) or 1)
            first = calls[0] - float(np.median(calls[1:])) if len(calls) > 1 else None
            mean = float(np.mean(calls[1:] if len(calls) > 1 else calls)) / per_call
            opt.end_epoch(epoch, float(np.median(calls)) / per_call, len(calls) * per_call, first, self._traced,
                          mean_s=mean)


def _synchronize(model):
    """The sync of every rank's weights of a DiLoCo or of auto's "diloco" candidate (nothing for other
    optimizers, or when already in sync)."""
    opt = _of_kind(model, (DiLoCo, DistributedOptimizer))
    if opt is not None:
        opt.synchronize()


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Per-rank backup after every epoch and resume, for model.fit with tf_commlib (the one such
    mechanism: tfc_apps.train and the DAWNBench script use it).

    * One backup per rank, in backup_dir/rank<R> (backup_dir on a shared file system, or node-local
      with the same ranks on the same nodes after a restart): model.save_weights saves the model
      with all of its optimizer's variables, which hold what differs by rank (the residuals, DGC
      momentum, the state-owner tag the consistency check reads) and the rest of the training
      state (a LossScaleOptimizer's loss scale and step counter, the wrapped optimizer's slots:
      SGD momentum, pto.LARS/LAMB moments, the iteration count). The training metadata adds
      DistributedOptimizer's target density and AdaptiveDensity's state (the last choice, its
      baseline and gain sums), which are Python values; the collective schedule and the warm-up
      follow from the epoch.
    * Double checkpoint: each save keeps the previous one (latest.weights.h5.bkp,
      training_metadata.json.bkp) and writes through temporary files, so an interrupted save leaves
      an intact backup. A job killed while its ranks were saving one epoch leaves some ranks an
      epoch ahead: on restore (a collective: every rank's fit starts together) those go back to
      their previous backup, so that all ranks resume at one epoch; ranks further apart, or an
      ahead rank without its previous backup, raise RuntimeError on every rank.
    * delete_checkpoint=True removes the rank's backup when fit ends on every rank (one allreduce
      first: where a rank failed, e.g. in its last save, the others keep theirs); False keeps it
      (for a loop that calls fit once per epoch, which resume_epoch() tells where to start).

    Backups are per epoch (no save_freq): a common resume epoch needs epoch-aligned saves.
    """

    def __init__(self, backup_dir, delete_checkpoint=True):
        self.rank_dir = self.rank_dir_of(backup_dir)
        super().__init__(self.rank_dir, double_checkpoint=True, delete_checkpoint=delete_checkpoint)

    @staticmethod
    def rank_dir_of(backup_dir, rank=None):
        """backup_dir/rank<R> (this rank's by default)."""
        return os.path.join(os.fspath(backup_dir), f"rank{current_topology().rank if rank is None else rank}")

    @classmethod
    def resume_epoch(cls, backup_dir):
        """The epoch all ranks resume at from the backups in backup_dir (0 without any), as
        BackupAndRestore's restore will set it; RuntimeError where they cannot resume at one epoch.
        A collective: call it on every rank."""
        rank_dir = cls.rank_dir_of(backup_dir)
        return _common_epoch(rank_dir, _saved_epoch(rank_dir), _saved_epoch(rank_dir, previous=True))

    def on_train_end(self, logs=None):
        # a collective before the backup goes: a rank whose last save failed (a full disk) never
        # reaches it, the others then fail here too and keep their backups, so the job can resume
        if self.delete_checkpoint:
            primitives.allreduce(tf.ones([1]), current_topology().world)
        super().on_train_end(logs)

    # -- restore ---------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)   # the latest backup, or the previous one where it is unreadable
        mine = _saved_epoch(self.rank_dir)
        common = _common_epoch(self.rank_dir, mine, _saved_epoch(self.rank_dir, previous=True))
        if (mine or 0) > common:   # this rank saved one epoch more than some other: back to its previous backup
            weights, prev_weights, metadata, prev_metadata = internals.backup_paths(self)
            for prev, cur in ((prev_weights, weights), (prev_metadata, metadata)):
                _replace_with_copy(prev, cur)
            self.restore_backup()

    def restore_backup(self):
        """BackupAndRestore's restore of the latest backup (its _load_model), then this rank's
        sharded-state check and tf_commlib's metadata. A DiLoCo that the load builds first gets the
        model's statistics to average (its variables are then those it saved)."""
        opt = _of_kind(self.model, DiLoCo)
        if opt is not None and not opt.built:
            opt.track_statistics(self.model.non_trainable_variables)
        internals.load_backup(self)
        _, _, metadata_path, _ = internals.backup_paths(self)
        opt = _distributed_or_none(self.model)
        if opt is not None and opt._sharded is not None:   # a sharded state: this rank's slices
            opt._sharded.check_layout()
        if os.path.exists(metadata_path):
            with open(metadata_path) as f:
                state = json.load(f).get("tf_commlib")
            opt = _distributed_or_none(self.model)
            if state and opt is not None:
                if state.get("target_density") is not None:
                    opt.set_target_density(state["target_density"])
                opt.plan.restore_adaptive_state(state.get("adaptive"))   # AdaptiveDensity takes it up
                if state.get("auto") and opt.auto_epochs is not None:
                    opt.auto_epochs.restore(state["auto"])

    # -- save ------------------------------------------------------------------------------
    def write_backup(self):
        """BackupAndRestore's save (its _save_model): weights and metadata, each written atomically
        after the previous backup was copied aside."""
        os.makedirs(self.rank_dir, exist_ok=True)
        _synchronize(self.model)   # a DiLoCo's pending exchange is applied before it is saved
        weights, prev_weights, metadata_path, prev_metadata = internals.backup_paths(self)
        for cur, prev in ((weights, prev_weights), (metadata_path, prev_metadata)):
            if os.path.exists(cur):
                _replace_with_copy(cur, prev)
        epoch, batch = internals.backup_position(self)
        metadata = {"epoch": epoch, "batch": batch}
        opt = _distributed_or_none(self.model)
        if opt is not None:
            metadata["tf_commlib"] = {"target_density": float(opt.target_density),
                                      "adaptive": opt.plan.adaptive_state,
                                      "auto": None if opt.auto_epochs is None else opt.auto_epochs.state()}
        tmp = weights + ".tmp.weights.h5"
        self.model.save_weights(filepath=tmp, overwrite=True)
        os.replace(tmp, weights)
        _write_atomically(metadata_path, json.dumps(metadata))


internals.override_backup(BackupAndRestore, BackupAndRestore.restore_backup, BackupAndRestore.write_backup)


def _of_kind(model, kind):
    """The model's tf_commlib optimizer where it is a `kind` (DistributedOptimizer or DiLoCo), else None."""
    try:
        opt = distributed_optimizer(model)
    except ValueError:
        return None
    return opt if isinstance(opt, kind) else None


def _distributed_or_none(model):
    """The model's DistributedOptimizer (a DiLoCo's state is all in its variables), or None."""
    return _of_kind(model, DistributedOptimizer)


def _write_atomically(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _replace_with_copy(src, dst):
    shutil.copyfile(src, dst + ".tmp")
    os.replace(dst + ".tmp", dst)


def _saved_epoch(rank_dir, previous=False):
    """The epoch a rank's backup (or its previous one) ends at; None without one."""
    path = os.path.join(rank_dir, "training_metadata.json" + (".bkp" if previous else ""))
    weights = os.path.join(rank_dir, "latest.weights.h5" + (".bkp" if previous else ""))
    if not (os.path.exists(path) and os.path.exists(weights)):
        return None
    with open(path) as f:
        return int(json.load(f)["epoch"])


def _common_epoch(rank_dir, mine, previous):
    """The epoch every rank resumes at: the smallest of the ranks' latest backups, which a rank one
    epoch ahead reaches with its previous backup. RuntimeError on every rank otherwise."""
    topo = current_topology()
    ask = [-1 if mine is None else mine, -1 if previous is None else previous]
    table = primitives.allgather(tf.constant([ask], tf.int64), topo.world).numpy().tolist()
    latest = [max(e, 0) for e, _ in table]
    common = min(latest)
    stuck = [r for r, (e, p) in enumerate(table) if max(e, 0) > common and p != common]
    if stuck:
        raise RuntimeError(
            f"BackupAndRestore: the ranks' backups in {os.path.dirname(rank_dir)} end at epochs {latest} "
            f"(previous backups: {[p if p >= 0 else None for _, p in table]}); ranks {stuck} cannot go back to "
            f"epoch {common}, so the ranks cannot resume at one epoch (remove the directory to start afresh)")
    return common


def default_callbacks(root_rank=0):
    """The callbacks a tf_commlib model.fit wants, in this order: the start broadcast, the compiled
    model's check, the nodes' sync at epoch ends, the epochs' schedule and auto's measurements, and the
    metrics' average (each one job; BroadcastGlobalVariables and CompileGuard are needed by a model
    whose ranks start apart or that compile wrapped in a per-rank loss scale, which otherwise fails)."""
    return [BroadcastGlobalVariables(root_rank), CompileGuard(), NodeSync(), CompressionScheduler(), MetricAverage()]
