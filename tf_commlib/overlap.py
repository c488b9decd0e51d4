"""Overlap of gradient aggregation with backprop inside tf.function (model.fit's graph mode).

A bucket's aggregation may start as soon as its own gradients exist (tf_commlib.fusion packs them
in backprop order, so bucket 0 holds the last layers, whose gradients come first), while backprop
still computes the first layers'. Inside a tf.function, TensorFlow's automatic control
dependencies chain every stateful op that takes no resource input in program order (whatever
their data dependencies): the shared-memory collectives (tf_commlib.shm), stateful random ops of
the selectors, tf.timestamp. Chained, bucket 1's first collective would wait for bucket 0's last,
and a bucket traced before another whose gradients come later would wait for them.
``run_independently`` takes the ops of one bucket out of that chain: they keep their data and
resource dependencies (residual variables, the step), nothing else. This is safe for the
collectives because none relies on program order across buckets: Horovod pairs ops by name, and a
shared-memory op in a graph has its own segments (tf_commlib.shm); each of them is asynchronous
(Horovod's TF ops and ops/shm/shm_kernels.cc are AsyncOpKernels), so one waiting for the other
ranks holds none of the inter-op threads that backprop needs.

``Timeline`` records when this happens (opt-in, for tests and profiling).
"""
import tensorflow as tf

from tf_commlib import internals


def _takes_resource(op):
    return any(t.dtype == tf.resource for t in op.inputs)


def op_count():
    """The number of ops in the default graph (None eagerly): the start for run_independently."""
    if tf.executing_eagerly():
        return None
    return len(tf.compat.v1.get_default_graph().get_operations())


def run_independently(since):
    """Exempts the stateful ops without a resource input that were added to the default graph after
    ``op_count()`` returned ``since`` from the program-order chain of automatic control
    dependencies; they still run (before the function returns). A no-op eagerly or outside a
    tf.function."""
    if since is None or tf.executing_eagerly():
        return
    graph = tf.compat.v1.get_default_graph()
    manager = internals.acd_manager(graph)
    if manager is None:
        return
    for op in graph.get_operations()[since:]:
        if internals.is_stateful(op) and not _takes_resource(op):   # the chain's own test
            manager.run_independently(op)


def after(tensor, previous):
    """tensor, available only once every tensor in ``previous`` exists (None entries and an empty
    or None list: tensor itself). The aggregators start bucket i + 1 after bucket i's results, so
    that one bucket's collectives are in flight at a time: the buckets still overlap backprop (they
    come in backprop order and bucket 0 starts when its own gradients exist), but they do not run
    all at once. A shared-memory collective waits for the other ranks on a thread of its own that
    polls (ops/shm/shm_channel.cc); with every bucket of a model in flight, dozens of polling threads
    per rank took the cores that the ranks compute on (ResNet-50 in 1 MB buckets, hitopk on 2x2 on
    one machine: about 5x the aggregation's time)."""
    previous = [t for t in (previous if isinstance(previous, (list, tuple)) else [previous]) if t is not None]
    if tensor is None or not previous or tf.executing_eagerly():
        return tensor
    with tf.control_dependencies(previous):
        return tf.identity(tensor)


def after_all(tensors):
    """The tensors (None kept), each available only once all of them exist: aggregation that waits
    for the whole of backprop (``overlap=False``, the fp32 baseline), whatever the buckets."""
    present = [t for t in tensors if t is not None]
    if not present:
        return list(tensors)
    with tf.control_dependencies(present):
        return [None if t is None else tf.identity(t) for t in tensors]


class Timeline:
    """When tensors came to exist, per key: ``stamp(key, t)`` returns t after a tf.timestamp() that
    runs once t exists has been written to the key's variable; ``times()`` reads the last value of
    each key (seconds since the epoch, float64; NaN before the first stamp). Works eagerly and in
    tf.function (one variable per key, made on first use, so a stamp orders nothing but itself).

    GradientAggregator(execution=ExecutionSettings(timeline=...)) stamps ("bucket", tag, i) when bucket i's aggregation starts
    (its gradients exist and the consistency check passed); DistributedOptimizer.timeline stamps
    ("gradient", i) when the gradient of its i-th variable reaches apply(), and hands the timeline
    to its aggregators (tag: the group's index)."""

    def __init__(self):
        self._stamps = {}

    def stamp(self, key, tensor):
        if tensor is None:
            return None
        if key not in self._stamps:
            with tf.init_scope():
                self._stamps[key] = tf.Variable(float("nan"), dtype=tf.float64, trainable=False,
                                                   name="timeline")
        since = op_count()
        with tf.control_dependencies([tensor]):
            when = tf.timestamp()
        self._stamps[key].assign(when)
        with tf.control_dependencies([when]):
            out = tf.identity(tensor)
        run_independently(since)
        return out

    def times(self):
        return {key: float(v.numpy()) for key, v in self._stamps.items()}
