"""Variables of mixed dtypes and shapes, different on every rank (broadcast / average tests)."""
import numpy as np


def rank_values(rank):
    g = np.random.default_rng(rank)
    return [g.standard_normal((3, 4)).astype(np.float32), np.int64(1000 * rank + 7), np.zeros(0),
            g.standard_normal(5), g.standard_normal((2, 1, 2)).astype(np.float32)]
