"""scatter_add against numpy.add.at."""
import numpy as np
import pytest
import tensorflow as tf

from tf_commlib.ops import scatter_add


def reference(indices, values, size):
    out = np.zeros(size, dtype=values.dtype)
    np.add.at(out, indices, values)
    return out


@pytest.mark.parametrize("vdtype", [np.float32, np.float16, tf.bfloat16.as_numpy_dtype])
@pytest.mark.parametrize("idtype", [np.int32, np.int64])
@pytest.mark.parametrize("size,n", [(10, 7), (1000, 5000), (300_000, 200_000), (5, 0), (0, 0)])
def test_matches_numpy(vdtype, idtype, size, n):
    rng = np.random.default_rng(size + n)
    indices = rng.integers(0, max(size, 1), n).astype(idtype)
    values = rng.standard_normal(n).astype(vdtype)
    got = scatter_add(indices, values, size).numpy()
    assert got.dtype == np.dtype(vdtype) and got.shape == (size,)
    np.testing.assert_array_equal(got, reference(indices, values, size))


def test_all_duplicate_indices_sum_in_order():
    values = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    indices = np.full(values.shape, 3, np.int32)
    got = scatter_add(indices, values, 400_000).numpy()
    np.testing.assert_array_equal(got, reference(indices, values, 400_000))
    assert np.count_nonzero(got) == 1


def test_inside_tf_function():
    f = tf.function(lambda i, v: scatter_add(i, v, 8))
    got = f(tf.constant([1, 1, 7]), tf.constant([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(got.numpy(), [0, 3, 0, 0, 0, 0, 0, 3])
    assert got.shape == (8,)


@pytest.mark.parametrize("indices,values,size,message", [
    ([0, 10], [1.0, 2.0], 10, r"indices\[1\] = 10 is not in \[0, 10\)"),
    ([0, -1], [1.0, 2.0], 10, r"indices\[1\] = -1 is not in \[0, 10\)"),
    ([0, 1, 2], [1.0, 2.0], 10, "length mismatch: indices has 3 elements, values has 2"),
    ([0], [1.0], -3, "size must be non-negative, got -3"),
])
def test_bad_input_names_the_problem(indices, values, size, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        scatter_add(np.array(indices, np.int32), np.array(values, np.float32), size)


def test_non_float_values_rejected():
    with pytest.raises(tf.errors.InvalidArgumentError, match="values must be float32.*got int32"):
        scatter_add([0], np.array([1], np.int32), 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="indices must be int32 or int64"):
        scatter_add(np.array([0.0]), np.array([1.0], np.float32), 4)
