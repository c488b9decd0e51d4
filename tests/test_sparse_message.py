"""sparse_message.pack/unpack: rows are [index bytes | value bytes] exactly (the 4+4-byte rows take
an arithmetic fast path), and unpack gives back the same bits (NaN payloads, -0.0 included)."""
import numpy as np
import pytest
import tensorflow as tf

from tf_commlib.collectives.sparse_message import pack, unpack

CASES = [(np.float32, np.int32), (np.float32, np.int64), (np.float16, np.int32), (np.float64, np.int32)]


def reference_rows(values, indices):
    return np.concatenate([indices.view(np.uint8).reshape(len(indices), indices.itemsize),
                           values.view(np.uint8).reshape(len(values), values.itemsize)], axis=1)


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("k", [0, 1, 1000])
@pytest.mark.parametrize("value_dtype, index_dtype", CASES)
def test_pack_is_index_then_value_bytes_and_unpack_inverts_it(value_dtype, index_dtype, k, graph):
    rng = np.random.default_rng(k)
    values = rng.standard_normal(k).astype(value_dtype)
    if k:
        values[0] = -0.0
    if k > 2:
        values[1] = np.nan
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(value_dtype).itemsize]
        values.view(bits)[1] |= 1   # a NaN with a payload bit set
    indices = rng.integers(-2**31, 2**31 - 1, k).astype(index_dtype)
    p = tf.function(pack) if graph else pack
    u = tf.function(unpack, reduce_retracing=False) if graph else unpack
    rows = p(tf.constant(values), tf.constant(indices))
    np.testing.assert_array_equal(rows.numpy(), reference_rows(values, indices))
    got_values, got_indices = u(rows, tf.as_dtype(value_dtype), tf.as_dtype(index_dtype))
    assert got_values.numpy().tobytes() == values.tobytes()
    np.testing.assert_array_equal(got_indices.numpy(), indices)
