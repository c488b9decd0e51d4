"""DiLoCo(sync_every="auto"): the interval H between syncs across nodes, chosen from what the run measures.

``Window`` collects, between two choices, the seconds of the inner steps, of the syncs' work on the
training thread and of the exchanges between nodes; ``measured_times`` gathers every rank's medians
(one all-gather) into the numbers ``choose_interval`` turns into H. A smaller H lets the nodes drift
apart less (as many epochs to a target or fewer in docs/diloco.md's runs), so the smallest H whose
costs stay hidden is the fastest.
"""
import numpy as np
import tensorflow as tf

from tf_commlib import primitives
from tf_commlib.topology import topology as current_topology

AUTO_INTERVALS = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # the H that sync_every="auto" chooses from
AUTO_START = 8      # sync_every="auto": the H of the steps before the first measurement
HIDDEN = 0.8        # with overlap: an exchange between nodes takes at most this part of H steps' time
SYNC_WORK = 0.05    # with overlap: a sync's work on the training thread takes at most this part of it
EXPOSED = 0.2       # without overlap: a sync (its exchange included) adds at most this part of H steps' time


def choose_interval(exchange_s, sync_s, step_s, overlap=True):
    """The H of sync_every="auto": the smallest of AUTO_INTERVALS where an exchange between nodes
    (exchange_s seconds) and a sync's work on the training thread (sync_s) stay within HIDDEN and
    SYNC_WORK of H inner steps (step_s each) with overlap, or together within EXPOSED of them without;
    the largest where none does."""
    for name, value in (("exchange_s", exchange_s), ("sync_s", sync_s), ("step_s", step_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0 <= value < np.inf:
            raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    for h in AUTO_INTERVALS:
        steps = h * step_s
        if (exchange_s <= HIDDEN * steps and sync_s <= SYNC_WORK * steps) if overlap \
                else exchange_s + sync_s <= EXPOSED * steps:
            return h
    return AUTO_INTERVALS[-1]


class Window:
    """What sync_every="auto" measures between two decisions, in seconds per item: the inner steps (end_step
    to end_step), the syncs' work on the training thread (without waiting for an exchange; not those that
    traced a function) and the exchanges between nodes (on the background thread with overlap)."""

    def __init__(self, active):
        self.active = active   # records only for sync_every="auto"
        self.steps, self.work, self.exchange = [], [], []

    def add(self, kind, seconds):
        if self.active:
            getattr(self, kind).append(seconds)


def measured_times(window):
    """(exchange_s, sync_s, step_s) from every rank's medians over the window, or None where there is
    nothing to choose from yet: no exchange, fewer than 2 steps, or a rank that has timed no sync or no
    exchange without a trace. A collective where the window holds an exchange and 2 steps: it holds as
    many steps and syncs on every rank, so every rank gathers or none does, and all get the same numbers.
    The exchange is the least of the ranks' (the others' also count waiting for their partner), the
    sync work and step the slowest rank's (the pace)."""
    w = window
    if not w.exchange or len(w.steps) < 2:
        return None
    timed = [x for x in w.exchange if x == x]   # NaN: an exchange that traced
    local = np.array([[np.median(timed) if timed else -1.0, np.median(w.work) if w.work else -1.0,
                       np.median(w.steps)]])
    topo = current_topology()
    every = primitives.allgather(tf.constant(local), topo.world, name="diloco_interval").numpy() \
        if topo.size > 1 else local
    if every[:, :2].min() < 0:
        return None
    sync_s, step_s = (float(v) for v in every[:, 1:].max(axis=0))
    return float(every[:, 0].min()), sync_s, step_s
