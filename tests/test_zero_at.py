"""zero_at (DGC's momentum masking, in place) against numpy: the variable is 0 exactly at the flat
indices, eagerly and in tf.function; a read taken before keeps its value; bad input raises."""
import numpy as np
import pytest
import tensorflow as tf

from tf_commlib.ops import zero_at


def reference(value, indices):
    out = value.copy().ravel()
    out[indices] = 0
    return out.reshape(value.shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, tf.bfloat16.as_numpy_dtype])
@pytest.mark.parametrize("idtype", [np.int32, np.int64])
@pytest.mark.parametrize("graph", [False, True])
def test_matches_numpy(dtype, idtype, graph):
    rng = np.random.default_rng(3)
    value = (rng.standard_normal((4, 3, 5)) + 10).astype(dtype)   # no zeros of its own
    indices = np.array([0, 59, 7, 7, 31, 12], idtype)            # ends, a repeat, out of order
    v = tf.Variable(value)
    (tf.function(lambda: zero_at(v, indices)) if graph else lambda: zero_at(v, indices))()
    np.testing.assert_array_equal(v.numpy(), reference(value, indices))


def test_no_indices_and_scalars():
    v = tf.Variable(np.arange(1, 7, dtype=np.float32))
    tf.function(lambda: zero_at(v, tf.zeros([0], tf.int64)))()
    np.testing.assert_array_equal(v.numpy(), np.arange(1, 7))
    s = tf.Variable(2.5)
    zero_at(s, [0])
    assert s.numpy() == 0.0


def test_a_read_taken_before_keeps_its_value():
    v = tf.Variable(np.ones(1000, np.float32))
    before = v.read_value()   # may share the variable's buffer: zero_at must then write a copy
    zero_at(v, [1, 2, 3])
    assert before.numpy().sum() == 1000 and v.numpy().sum() == 997
    after = tf.convert_to_tensor(v)
    zero_at(v, [4])
    assert after.numpy().sum() == 997 and v.numpy().sum() == 996


@pytest.mark.parametrize("indices,message", [
    ([6], r"index out of range: indices\[0\] = 6 is not in \[0, 6\)"),
    ([1, -1], r"indices\[1\] = -1"),
    ([[1]], "indices must be a vector"),
    (np.array([1.0], np.float32), "indices must be int32 or int64"),
])
def test_bad_indices_raise(indices, message):
    v = tf.Variable(np.ones(6, np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        zero_at(v, indices)
    np.testing.assert_array_equal(v.numpy(), np.ones(6))


def test_integer_variable_raises():
    with pytest.raises(tf.errors.InvalidArgumentError, match="variable must be a float variable"):
        zero_at(tf.Variable([1, 2, 3]), [0])
