"""Wall-clock medians, shared by the cost model's calibration and the benchmarks."""
import time

import numpy as np


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
