"""DistributedOptimizer(algorithm="auto")'s candidate "diloco": for an epoch, local SGD inside the nodes
and a DiLoCo sync across them every H steps (docs/collectives.md, "DiLoCo rounds in auto").

* Every step: what the collectives would aggregate is averaged over the node's ranks only
  (diloco_sync.node_average), and the wrapped optimizer steps.
* Every H steps and at the epoch's end: tf_commlib.keras.DiLoCo's sync without overlap
  (diloco_sync.Syncs): each node's pseudo-gradient between nodes in 4 bits (CODEC) with error feedback,
  every rank going on from the nodes' mean (Lin et al.'s hierarchical local SGD). bench tta's
  ``diloco_h8_int4_no_overlap`` ends within a point of dense fp16's top-1 (docs/diloco.md).
* H: the smallest of interval.AUTO_INTERVALS up to MAX_INTERVAL whose sync adds at most interval.EXPOSED
  of H steps' time (bench tta: H = 8 within a point of dense fp16, 16 and more below); where probed,
  FIRST_INTERVAL until an epoch of it measured its syncs (the probe times an exchange and one node
  average, a third or less of a sync).
"""
import time

import keras
import numpy as np

import tensorflow as tf

from tf_commlib import alphabeta, replicas, timing
from tf_commlib.aggregator.chooser import default_candidates
from tf_commlib.collectives import codec as codecs
from tf_commlib.inter_mean import Exchanges, by_allreduce, shard_len
from tf_commlib.diloco_sync import Syncs, node_average
from tf_commlib.auto.interval import AUTO_INTERVALS, AUTO_START, Window, choose_interval

NAME = "diloco"     # its name among auto's candidates
CODEC = "int4"      # the pseudo-gradients' codec between nodes
MAX_INTERVAL = 8    # the largest H it runs
FIRST_INTERVAL = min(AUTO_START, MAX_INTERVAL)   # its H until an epoch of it measured its syncs


def times(d, m, n, params):
    """(node_s, exchange_s, sync_s): seconds of a step's node average of d float32 values, of a sync's
    exchange between nodes (this rank's slice in CODEC, as inter_mean sends it: an all-gather over the m
    nodes, or an allreduce of a float wire; a node's n ranks share its link) and of the sync's work
    inside the node."""
    s, wire = shard_len(d, n), codecs.get(CODEC)
    node = alphabeta.reducescatter(4 * n * s, n, params.alpha_intra, params.beta_intra) + \
        alphabeta.allgather(4 * s, n, params.alpha_intra, params.beta_intra)
    inter = alphabeta.ring_allreduce if by_allreduce(wire) else alphabeta.allgather
    exchange = inter(wire.bytes(s), m, params.alpha_inter, n * params.beta_inter)
    return node, exchange, node


def probe(d, topo, repeats=3):
    """(node_s, exchange_s, sync_s) measured on the link, the means over the ranks: a step's node average
    of d float32 values (a tf.function) and a sync's exchange of this rank's slice between nodes
    (inter_mean), each the median of ``repeats`` calls after a warm-up call; a sync's work inside the node
    taken as one node average. A collective."""
    from tf_commlib.inter_mean import inter_mean

    s, wire = shard_len(d, topo.n), codecs.get(CODEC)
    x = tf.random.stateless_normal([d], [0, topo.rank]) * 1e-3
    average = tf.function(lambda g: node_average([g], [g])[0])
    calls = (lambda: average(x), lambda: inter_mean(x[:s], topo, wire, 0, name="auto_diloco_probe")[0])
    seconds = [timing.median_time(lambda: timing.ready(call()), repeats) for call in calls]
    node, exchange = (replicas.summed(np.array(seconds, np.float64)) / topo.size).tolist()
    return node, exchange, node


def interval(exchange_s, sync_s, step_s):
    """H for these predicted seconds: choose_interval without overlap, at most MAX_INTERVAL."""
    return min(choose_interval(exchange_s, sync_s, step_s, overlap=False), MAX_INTERVAL)


def communication_s(d, m, n, params, compute_s, probed=None, h=None, epoch_steps=None):
    """(predicted seconds of communication per step over an interval, its H): the node average, and a
    sync's exchange and work spread over the interval's H steps of compute_s + the node average; from
    probed (probe's measured times) where given, else the formulas (times); H chosen unless given. An
    epoch of ``epoch_steps`` steps ends with a sync too: ceil(epoch_steps / H) syncs in it (an epoch of 4
    steps syncs every 4 steps whatever H is; ResNet-50 in 4-step epochs at 500 Mbit/s measured 1.9 s a
    step against 1.07 predicted at H = 8)."""
    node, exchange, sync = probed or times(d, m, n, params)
    h = h or interval(exchange, sync, compute_s + node)
    syncs_per_step = 1 / h if not epoch_steps else -(-int(epoch_steps) // h) / int(epoch_steps)
    return node + (exchange + sync) * syncs_per_step, h


class LocalRounds(Syncs):
    """The state and steps of the "diloco" candidate of ``owner`` (a DistributedOptimizer), its variables
    (start weights, residual, step counts) created on owner by build and the outer optimizer's
    added to owner's variables: checkpoints hold them."""
    overlap = False

    def __init__(self, owner, var_list):
        self.wire = codecs.get(CODEC)
        self.outer_optimizer = keras.optimizers.SGD(1.0)   # the nodes' mean
        self.timeline, self._pending, self._exchanges, self._window = None, None, Exchanges(), Window(False)
        self.interval = MAX_INTERVAL
        self.running = False   # this epoch runs it
        self.traced = None     # whether the traced step ran it (None: not traced yet)
        self.sync_s = 0.0      # seconds of this epoch's syncs, which run after a batch's end
        self.synced = []       # seconds of each of this epoch's syncs (not those that traced a function)
        self._build_syncs(owner, var_list, [])
        self.size = sum(int(np.prod(v.shape, dtype=np.int64)) for v in var_list)

    def start(self, h):
        """Begins an epoch of it, every H = h steps a sync, from the weights (the same on every rank)."""
        if h not in AUTO_INTERVALS:
            raise ValueError(f"h must be one of {AUTO_INTERVALS}, got {h!r}")
        self._restart_from_weights()
        self.synced_at.assign(self.steps_done)
        self.interval, self.running, self.sync_s, self.synced = int(h), True, 0.0, []

    def check_begin(self, index, h, restored):
        """ValueError on every rank where the ranks would begin different epochs: the candidate (its
        index), H, whether rounds ran or a backup of them was restored. One all-gather: called where rounds
        ran or were restored, before stop's collective (a fresh build, e.g. of a model's copy on an
        evaluation thread, calls none)."""
        rows = replicas.gathered(np.array([[index, h, int(self.running), int(restored)]], np.int64), "auto_rounds")
        if (rows != rows[0]).any():
            raise ValueError("algorithm 'auto': the ranks would begin different epochs, by rank (candidate "
                             f"index, H, rounds running, rounds restored): {rows.tolist()}")

    def stop(self, states):
        """Ends its epochs: the float variables ``states`` (the wrapped optimizer's, which stepped per node)
        averaged over every rank, where it ran. A collective."""
        if self.running:
            replicas.average_variables([v for v in states if tf.as_dtype(v.dtype).is_floating])
        self.running = False

    def average(self, updates):
        """The step's updates averaged over the node (inside the traced step); None stays None."""
        present = [i for i, u in enumerate(updates) if u is not None]
        like = self._tracked[:self._n_trainable]
        averaged = node_average([updates[i] for i in present], [like[i] for i in present])
        out = [None] * len(updates)
        for i, u in zip(present, averaged):
            out[i] = u
        return out

    def end_step(self):
        """Counts a step of an epoch that runs it; a sync every H steps."""
        if not self.running:
            return
        start, traced = time.perf_counter(), len(self._fns)
        steps = int(self.steps_done.assign_add(1).numpy())
        if steps - int(self.synced_at.numpy()) >= self.interval:   # H steps after the last sync (an epoch's end's too)
            self._timed_sync(steps // self.interval, steps)
        if len(self._fns) == traced:   # a sync that traced its functions is no measure of one
            self.sync_s += time.perf_counter() - start

    def _timed_sync(self, index, steps):
        """A sync after ``steps`` steps; its seconds (0 where it traced a function, no measure of one)."""
        start, traced = time.perf_counter(), len(self._fns)
        self._sync_now(index)
        self.synced_at.assign(steps)
        if len(self._fns) != traced:
            return 0.0
        self.synced.append(time.perf_counter() - start)
        return self.synced[-1]

    def synchronize(self):
        """Syncs the steps since the last sync (every rank then holds the same weights). A collective."""
        steps = int(self.steps_done.numpy())
        if steps > int(self.synced_at.numpy()):
            self.sync_s += self._timed_sync(-steps, steps)   # a negative index: no interval's seed

    def sent_bytes(self):
        """{"intra": B, "inter": B} per step, over an interval of the current H."""
        return {k: v / self.interval for k, v in self._bytes_of_interval(self.interval).items()}


def enabled(settings, topo, opt):
    """Whether "auto" of opt (a DistributedOptimizer) has the candidate: Auto.diloco (None: where the
    candidates are the default ones), several nodes, and an optimizer that is not sharded."""
    wanted = settings.candidates == default_candidates() if settings.diloco is None else settings.diloco
    return wanted and topo.m > 1 and not opt.shard_optimizer
