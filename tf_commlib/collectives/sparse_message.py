"""Sparse messages in one allgather: every selected entry travels as one row of bytes
[index | value] (RedSync's packed message), so values and indices cost one Horovod call, and ranks
may send different numbers of entries (threshold selectors)."""
import tensorflow as tf

from tf_commlib import primitives as P


def pack(values, indices):
    """[k] values and [k] indices -> [k, index bytes + value bytes] uint8 rows."""
    return tf.concat([tf.bitcast(indices, tf.uint8), tf.bitcast(values, tf.uint8)], axis=1)


def unpack(rows, value_dtype, index_dtype):
    """The inverse of pack: (values, indices)."""
    split = index_dtype.size
    return tf.bitcast(rows[:, split:], value_dtype), tf.bitcast(rows[:, :split], index_dtype)


def allgather_sparse(values, indices, process_set, name=None):
    """(values, indices) of every rank of the set, concatenated in rank order."""
    if process_set.size() == 1:   # the identity: no packing (two row-wise copies of the message)
        return tf.identity(values), tf.identity(indices)
    rows = P.allgather(pack(values, indices), process_set, name=name)
    return unpack(rows, values.dtype, indices.dtype)
