"""Wall-clock medians, shared by the cost model's calibration and the benchmarks, and the one
forward+backward step they time (compute_seconds, bench e2e's and the DAWNBench script's breakdowns)."""
import contextlib
import time

import numpy as np


def ready(result):
    """Blocks until every tensor in the (nested) result is computed by fetching one element of each.

    Not .numpy() of the whole tensor: that costs about one memory pass over it (6 ms for 4M floats,
    25 ms for 25M, measured on this machine), which no training step pays, so timings that end with
    it overstate every memory-bound step and the per-byte costs fitted from them."""
    import tensorflow as tf

    def first(t):
        if t is None:   # e.g. value_codec.allgather's part for codecs without parts
            return None
        t = tf.convert_to_tensor(t)
        return t.numpy() if t.shape.rank == 0 else tf.reshape(t, [-1])[:1].numpy()
    return tf.nest.map_structure(first, result)


def median_time(fn, repeats=5, warmup=1):
    """Median wall time of fn() in seconds; fn must block until its result is ready."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


class Timer:
    """Timed runs on every rank of a Horovod job: each run starts after a barrier on topo.world and
    a run's time is the slowest rank's."""

    def __init__(self, topo):
        self.topo, self.calls = topo, 0

    def barrier(self):
        import tensorflow as tf

        from tf_commlib import primitives
        self.calls += 1
        if self.topo.size == 1:
            return
        primitives.allreduce(tf.zeros([1]), self.topo.world, name=f"bench_barrier_{self.calls}").numpy()

    def max_over_ranks(self, times):
        import horovod.tensorflow as hvd
        import tensorflow as tf
        self.calls += 1
        t = tf.constant(times, tf.float64)
        if self.topo.size == 1:
            return t.numpy()
        return hvd.allreduce(t, op=hvd.Max, name=f"bench_max_{self.calls}").numpy()

    def interleaved(self, fns, repeats, warmup=1):
        """{name: median over runs of the slowest rank's time} for fns = {name: fn}, timed in rounds:
        each round runs every fn once, in an order rotated by one per round, so a burst of load on
        a shared machine lands on one run of several functions instead of on every run of one."""
        names = list(fns)
        times = {name: [] for name in names}
        for i in range(warmup + repeats):
            for j in range(len(names)):
                name = names[(i + j) % len(names)]
                self.barrier()
                start = time.perf_counter()
                fns[name]()
                if i >= warmup:
                    times[name].append(time.perf_counter() - start)
        maxed = self.max_over_ranks([t for name in names for t in times[name]]).reshape(len(names), repeats)
        return {name: float(np.median(maxed[j])) for j, name in enumerate(names)}


def forward_backward(model, x, y, loss):
    """A training step's forward and backward pass on the batch (x, y), as a tf.function without
    arguments returning the gradients of loss(y, model(x, training=True)) for model.trainable_variables
    (fit's GradientTape step, without the update). Builds the model if it is not yet (an inference
    call: no statistics change). Run it inside model_state_kept(model): a training pass moves the
    batch-norm statistics."""
    import tensorflow as tf

    if not callable(loss):
        raise ValueError(f"loss must be callable as loss(y_true, y_pred), got {loss!r}")
    if not (callable(model) and hasattr(model, "trainable_variables") and hasattr(model, "non_trainable_variables")):
        raise ValueError(f"model must be a Keras model, got {model!r}")
    model(x, training=False)
    variables = model.trainable_variables
    if not variables:
        raise ValueError("model has no trainable variables: nothing to back-propagate")

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        return tape.gradient(value, variables)
    return step


@contextlib.contextmanager
def model_state_kept(model):
    """Puts the model's non-trainable variables (batch-norm statistics, which a training pass updates
    on each rank from its own data) back on exit, so that timing a step never alters training."""
    state = list(model.non_trainable_variables)
    saved = [v.numpy() for v in state]
    try:
        yield
    finally:
        for v, value in zip(state, saved):
            v.assign(value)
