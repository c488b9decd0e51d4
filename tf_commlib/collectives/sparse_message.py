"""Sparse messages in one allgather: every selected entry travels as one row of bytes
[index | value] (RedSync's packed message), so values and indices cost one Horovod call, and ranks
may send different numbers of entries (threshold selectors)."""
import sys

import tensorflow as tf

from tf_commlib import primitives


_LITTLE = sys.byteorder == "little"
_LOW = tf.constant(0xFFFFFFFF, tf.uint64)
_32 = tf.constant(32, tf.uint64)


def _words(values, indices):
    """True when a row is one 64-bit word [index | value] (4-byte index and value, little endian):
    packing is then element-wise arithmetic instead of a row-wise concat (2-3x faster)."""
    return _LITTLE and indices.dtype.size == 4 and values.dtype.size == 4


def pack(values, indices):
    """[k] values and [k] indices -> [k, index bytes + value bytes] uint8 rows."""
    if _words(values, indices):
        low = tf.cast(tf.bitcast(indices, tf.uint32), tf.uint64)
        high = tf.bitwise.left_shift(tf.cast(tf.bitcast(values, tf.uint32), tf.uint64), _32)
        return tf.bitcast(tf.bitwise.bitwise_or(low, high), tf.uint8)
    return tf.concat([tf.bitcast(indices, tf.uint8), tf.bitcast(values, tf.uint8)], axis=1)


def unpack(rows, value_dtype, index_dtype):
    """The inverse of pack: (values, indices)."""
    if _LITTLE and index_dtype.size == 4 and value_dtype.size == 4:
        words = tf.bitcast(rows, tf.uint64)
        low = tf.cast(tf.bitwise.bitwise_and(words, _LOW), tf.uint32)
        high = tf.cast(tf.bitwise.right_shift(words, _32), tf.uint32)
        return tf.bitcast(high, value_dtype), tf.bitcast(low, index_dtype)
    split = index_dtype.size
    return tf.bitcast(rows[:, split:], value_dtype), tf.bitcast(rows[:, :split], index_dtype)


def allgather_sparse(values, indices, process_set, name=None):
    """(values, indices) of every rank of the set, concatenated in rank order."""
    if process_set.size() == 1:   # the identity: no packing (two row-wise copies of the message)
        return tf.identity(values), tf.identity(indices)
    rows = primitives.allgather(pack(values, indices), process_set, name=name)
    return unpack(rows, values.dtype, indices.dtype)
