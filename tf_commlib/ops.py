"""Python API of the custom ops: sparse decompression (scatter_add) and the top-k selectors."""
import tensorflow as tf

from tf_commlib._loader import ops as _ops

FLOAT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def _invalid(msg):
    return tf.errors.InvalidArgumentError(None, None, msg)


def check_float(x, name):
    """Converts x to a tensor and checks it holds float32/float16/bfloat16."""
    x = tf.convert_to_tensor(x)
    if x.dtype not in FLOAT_DTYPES:
        raise _invalid(f"{name} must be float32, float16 or bfloat16, got {x.dtype.name}")
    return x


def scatter_add(indices, values, size):
    """Dense vector of length ``size`` with ``values`` added at ``indices`` (repeats are summed).

    This is the decompression step of every sparse collective. ``indices`` is int32 or int64,
    ``values`` float32/float16/bfloat16 of the same length; out-of-range indices raise.
    """
    values = check_float(values, "values")
    indices = tf.convert_to_tensor(indices)
    if indices.dtype not in (tf.int32, tf.int64):
        raise _invalid(f"indices must be int32 or int64, got {indices.dtype.name}")
    return _ops.commlib_scatter_add(indices, values, tf.cast(size, tf.int64))
