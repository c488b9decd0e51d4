"""Wall-clock medians, shared by the cost model's calibration and the benchmarks."""
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
