"""How many entries a sparse collective selects: ceil(density * n), at least 1."""
import math

import tensorflow as tf


def num_selected(density, n):
    """A Python int for a Python density, else an int64 tensor (density held in a variable)."""
    if isinstance(density, (int, float)):
        return max(1, math.ceil(density * n))
    k = tf.math.ceil(tf.cast(density, tf.float64) * float(n))
    return tf.maximum(tf.constant(1, tf.int64), tf.cast(k, tf.int64))
