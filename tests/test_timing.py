"""timing.Timer.interleaved (bench comm, tfc_apps.bench.pto): every function runs once per round, in rotated
order, and the result is the median over rounds of the slowest rank's time (here one rank)."""
import numpy as np

from tf_commlib.timing import Timer


class OneRank(Timer):
    def __init__(self):
        super().__init__(topo=None)
        self.barriers = 0

    def barrier(self):
        self.barriers += 1

    def max_over_ranks(self, times):
        return np.asarray(times, np.float64)


def test_interleaved_rotates_order_and_takes_medians(monkeypatch):
    order, clock = [], [0.0]
    cost = {"a": [5, 1, 1, 1], "b": [5, 2, 2, 9], "c": [5, 3, 3, 3]}   # seconds, per call of each

    def fn(name):
        def run():
            order.append(name)
            clock[0] += cost[name][sum(o == name for o in order) - 1]
        return run

    monkeypatch.setattr("tf_commlib.timing.time.perf_counter", lambda: clock[0])
    timer = OneRank()
    result = timer.interleaved({n: fn(n) for n in "abc"}, repeats=3, warmup=1)
    assert order == list("abc" "bca" "cab" "abc")
    assert timer.barriers == 12
    assert result == {"a": 1.0, "b": 2.0, "c": 3.0}   # warm-up (5 s) dropped; b's one slow run (9 s) is not the median


def test_forward_backward_is_fits_gradient_and_the_state_is_put_back():
    import keras
    import pytest
    import tensorflow as tf

    from tf_commlib.timing import forward_backward, model_state_kept

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization(),
                              keras.layers.Dense(2)])
    x, y = tf.random.stateless_normal((8, 4), (3, 4)), tf.one_hot(tf.range(8) % 2, 2)
    loss = keras.losses.CategoricalCrossentropy(from_logits=True)
    step = forward_backward(model, x, y, loss)
    with tf.GradientTape() as tape:
        want = tape.gradient(loss(y, model(x, training=True)), model.trainable_variables)
    before = [v.numpy() for v in model.non_trainable_variables]   # moved by the training pass above
    with pytest.raises(RuntimeError, match="inside"):
        with model_state_kept(model):
            got = step()
            assert not all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.non_trainable_variables))
            raise RuntimeError("inside")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.non_trainable_variables))
    with pytest.raises(ValueError, match="loss must be callable"):
        forward_backward(model, x, y, "mse")
    with pytest.raises(ValueError, match="model must be a Keras model"):
        forward_backward(3, x, y, loss)
