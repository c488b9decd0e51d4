"""The syncs of DiLoCo across nodes (tf_commlib.keras.diloco): what a node sends, the exchange between
nodes, the outer step on the mean, and where every rank goes on from.

``Syncs`` is mixed into the DiLoCo optimizer and works on the state its ``__init__`` and ``build``
create, among others: ``starts`` (the start weights, which ``outer_optimizer`` steps), ``anchors`` (with
overlap: where a node's progress is counted from; else the start weights), ``residual`` (a lossy
codec's error feedback), ``wire`` (the codec), ``_tracked`` (the weights and the statistics averaged at
a sync), ``_exchanges`` and ``_pending`` (the background exchange), ``_window`` (the measurements
sync_every="auto" chooses from) and ``timeline``.

* ``_sync_now``: send the node's progress, wait for the inter-node mean, outer step, every rank from the
  new start weights.
* ``_sync_overlapped``: send this interval's progress on a background thread, apply the previous sync's
  mean, go on from the start weights plus this interval's progress.
* ``_flush``: apply a pending exchange (an epoch's end).
"""
import time

import numpy as np
import tensorflow as tf

from tf_commlib import link_bytes, primitives
from tf_commlib.collectives.interface import plain_python
from tf_commlib.inter_mean import inter_bytes, inter_mean, node_mean, shard_len, traces
from tf_commlib.topology import topology as current_topology


def flat(tensors):
    """The tensors as one flat float32 vector."""
    return tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], 0)


def unflat(values, like):
    """flat's inverse: the flat float32 values as tensors of like's shapes and dtypes."""
    sizes = [int(np.prod(v.shape, dtype=np.int64)) for v in like]
    return [tf.cast(tf.reshape(p, v.shape), v.dtype) for p, v in zip(tf.split(values, sizes), like)]


def node_average(grads, like):
    """The gradients (None: zero) averaged over the node's ranks: one reduce-scatter and one all-gather of
    them packed flat (a node of one rank: as they are)."""
    grads = [tf.zeros(v.shape, v.dtype) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, like)]
    topo = current_topology()
    if topo.n == 1:
        return grads
    flat_grads = flat(grads)
    d = int(flat_grads.shape[0])
    s = shard_len(d, topo.n)
    shard = node_mean(tf.pad(flat_grads, [[0, topo.n * s - d]]), topo.intra, topo.n)
    return unflat(primitives.allgather(shard, topo.intra)[:d], like)


class Syncs:
    """The sync methods of DiLoCo (module doc)."""

    def _build_syncs(self, owner, var_list, statistics):
        """The state of the syncs, as variables of ``owner`` (a Keras optimizer, so that checkpoints hold
        them): the start weights (and with ``self.overlap`` the anchors), a lossy codec's residual, the step
        count and the step of the last sync, for var_list and the statistics averaged at a sync; builds
        ``self.outer_optimizer`` on the start weights."""
        topo = current_topology()
        self._tracked = list(var_list) + list(statistics)
        d = sum(int(np.prod(v.shape, dtype=np.int64)) for v in self._tracked)
        self._d, self._s = d, shard_len(d, topo.n)
        trainable = sum(int(np.prod(v.shape, dtype=np.int64)) for v in var_list)
        # this rank's slice: its pseudo-gradient entries go in the codec, statistics in float32 (a lossy
        # codec could make a variance negative)
        self._coded = int(np.clip(trainable - topo.local * self._s, 0, self._s))
        self.starts = [owner.add_variable_from_reference(v, "diloco_start") for v in self._tracked]
        self.anchors = [owner.add_variable_from_reference(v, "diloco_anchor") for v in self._tracked] \
            if self.overlap else self.starts
        self.residual = owner.add_variable((self._s,), initializer="zeros", name="diloco_residual") \
            if not self.wire.exact else None
        self.steps_done = owner.add_variable((), dtype="int64", initializer="zeros", name="diloco_steps")
        self.synced_at = owner.add_variable((), dtype="int64", initializer="zeros", name="diloco_synced_at")
        with tf.init_scope():   # eagerly, also when build runs while the first step is traced
            primitives.prepare()
            self._restart_from_weights()
        self.outer_optimizer.build(self.starts[:len(var_list)])
        self._n_trainable = len(var_list)
        self._fns = {}

    def rank_state(self):
        """This rank's per-rank state (numpy): the residual of its slice of the node's pseudo-gradient,
        with the slice's place (ranks per node, local index, slice length), once an exchange in flight
        (overlap) has written it; None before build."""
        if not hasattr(self, "_s"):
            return None
        if self.residual is not None and self._pending is not None:   # the exchange in flight writes it
            self._exchanges.wait(self._pending)
        topo = current_topology()
        return {"residual": None if self.residual is None else np.asarray(self.residual.numpy()),
                "place": [topo.n, topo.local, self._s]}

    def load_rank_state(self, state):
        """rank_state() of this rank on any layout (None: it owes nothing): the residual where this rank
        holds the same slice of its node's pseudo-gradient (the same ranks per node and local index, as
        a node that lived through a reset keeps), else zero. Returns 1 where a residual not zero was
        dropped, else 0."""
        if getattr(self, "residual", None) is None:
            return 0
        topo = current_topology()
        mine = None if state is None else state["residual"]
        same = mine is not None and state["place"] == [topo.n, topo.local, self._s]
        self.residual.assign(mine if same else tf.zeros_like(self.residual))
        return int(mine is not None and not same and bool(np.any(mine)))

    def _restart_from_weights(self):
        """The start weights (and anchors) set to the tracked variables' values (eagerly)."""
        for v, s in zip(self._tracked, self.starts):
            s.assign(tf.cast(v, s.dtype))
        if self.overlap:
            for v, a in zip(self._tracked, self.anchors):
                a.assign(tf.cast(v, a.dtype))

    def _bytes_of_interval(self, h):
        """{"intra": B, "inter": B} this rank sends in h inner steps (their node averages) and one sync."""
        topo = current_topology()
        m, n = topo.m, topo.n
        if n > 1:
            g = shard_len(sum(int(np.prod(v.shape, dtype=np.int64)) for v in self._tracked[:self._n_trainable]), n)
            step = link_bytes.add(link_bytes.per_rank("reducescatter", 4 * n * g, "intra", m, n),
                                  link_bytes.per_rank("allgather", 4 * g, "intra", m, n))
            sync = link_bytes.add(link_bytes.per_rank("reducescatter", 4 * n * self._s, "intra", m, n),
                                  link_bytes.per_rank("allgather", 4 * self._s, "intra", m, n))
        else:
            step = sync = link_bytes.add()
        steps = link_bytes.add(*([step] * h))
        return link_bytes.add(steps, sync, inter_bytes(self._s, self.wire, m, n, self._coded))

    def _fn(self, key, fn):
        if key not in self._fns:
            self._fns[key] = tf.function(plain_python(fn), autograph=False)
        return self._fns[key]

    def _progress(self):
        """anchor - weights, flat: the node's pseudo-gradient (and statistics' drift) since its anchor."""
        return flat([a - tf.cast(v, a.dtype) for a, v in zip(self.anchors, self._tracked)])

    def _send(self):
        """(the progress, this rank's slice of its node mean)."""
        topo = current_topology()
        x = self._progress()
        padded = tf.pad(x, [[0, topo.n * self._s - self._d]])
        return x, node_mean(padded, topo.intra, topo.n) if topo.n > 1 else padded

    def _exchange(self, shard, index):
        """The inter-node mean of the shard (inter_mean; on the background thread with overlap)."""
        topo = current_topology()
        start = time.perf_counter()
        if self.timeline is not None:
            self.timeline.append(("exchange_start", index, start))
        send = shard if self.residual is None else shard + self.residual
        seed = index * 7919 + topo.node * 104729 + topo.local   # independent rounding on every rank
        traced = traces()
        mean, own = inter_mean(send, topo, self.wire, seed, self._coded, name="diloco_inter")
        if self.residual is not None:
            left = send - own
            self.residual.assign(tf.where(tf.math.is_finite(left), left, tf.zeros_like(left)))
        end = time.perf_counter()
        # one that traced the codec's functions is no measure of one (NaN: every rank records an exchange)
        self._window.add("exchange", end - start if traces() == traced else float("nan"))
        if self.timeline is not None:
            self.timeline.append(("exchange_end", index, end))
        return mean

    def _receive(self, mean):
        """The outer step with the mean pseudo-gradient (all-gathered inside the node); skipped by every
        rank where it is not finite. Statistics: start minus their mean drift."""
        topo = current_topology()
        full = primitives.allgather(mean, topo.intra) if topo.n > 1 else mean
        parts = unflat(full[:self._d], self.starts)
        k = self._n_trainable
        finite = tf.reduce_all(tf.math.is_finite(full))

        def step():
            self.outer_optimizer.apply(parts[:k], self.starts[:k])
            for s, p in zip(self.starts[k:], parts[k:]):
                s.assign_sub(p)
            return tf.constant(True)

        return tf.cond(finite, step, lambda: tf.constant(False))

    def _restart(self, x=None, sent=True):
        """Every tracked variable from the start weights; with overlap plus the node's progress x (none where
        x is not finite), and the anchor there too when x was sent, else at the start weights."""
        if x is not None:
            x = unflat(tf.where(tf.reduce_all(tf.math.is_finite(x)), x, tf.zeros_like(x)), self.starts)
        for i, (v, s) in enumerate(zip(self._tracked, self.starts)):
            value = s if x is None else s - x[i]
            v.assign(tf.cast(value, v.dtype))
            if self.overlap:
                self.anchors[i].assign(value if sent else s)

    def _timed(self, sync, index):
        """Runs sync(index), which returns the seconds it waited for an exchange between nodes; records its
        work on the training thread besides (where it traced no function)."""
        start, traced = time.perf_counter(), len(self._fns)
        waited = sync(index)
        if len(self._fns) == traced:
            self._window.add("work", time.perf_counter() - start - waited)

    def _sync_now(self, index):
        """A sync without overlap: exchange, outer step, every rank from the new start weights. Returns the
        exchange's seconds."""
        _, shard = self._fn("send", self._send)()
        start = time.perf_counter()
        mean = self._exchange(shard, index)
        waited = time.perf_counter() - start
        self._fn("receive", self._receive)(mean)
        self._fn("restart", lambda: self._restart())()
        return waited

    def _sync_overlapped(self, index):
        """Sends this interval's progress; applies the previous sync's mean; goes on from there. Returns the
        seconds it waited for that mean."""
        x, shard = self._fn("send", self._send)()
        box = self._exchanges.submit(lambda: self._exchange(shard, index))
        previous, self._pending, waited = self._pending, box, 0.0
        if previous is not None:
            start = time.perf_counter()
            mean = self._exchanges.wait(previous)
            waited = time.perf_counter() - start
            self._fn("receive", self._receive)(mean)
        self._fn("rebase", lambda p: self._restart(p, sent=True))(x)
        return waited

    def _flush(self):
        """Applies a pending exchange; the node goes on from the start weights plus its unsent progress."""
        box, self._pending = self._pending, None
        if box is not None:
            x = self._fn("progress", self._progress)()
            self._fn("receive", self._receive)(self._exchanges.wait(box))
            self._fn("keep", lambda p: self._restart(p, sent=False))(x)
