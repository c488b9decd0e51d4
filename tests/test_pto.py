"""pto: the parallel tensor operator and LARS / LAMB against numpy, in one process (multi-rank runs
are in tests/test_pto_ranks.py)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import pto
from tests import pto_reference as ref

SHAPES = [(6, 5), (7,), (3, 4, 2), (4,), (5, 3)]
STEPS = 4


def problem(seed=0):
    """Weights and per-step gradients; variable 3 starts at zero (||w|| = 0) and variable 4 gets a
    zero gradient at every step (||g|| = 0)."""
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    weights[3][:] = 0
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
    for g in grads:
        g[4][:] = 0
    return weights, grads


def run(opt, weights, grads, graph=False):
    names = ["dense/kernel", "dense/bias", "conv/kernel", "bn/gamma", "out/kernel"]
    vs = [keras.Variable(w, name=n.split("/")[1]) for w, n in zip(weights, names)]
    for v, n in zip(vs, names):   # the paths exclusion patterns see
        v._path = n
    step = tf.function(lambda gs: opt.apply(gs, vs)) if graph else (lambda gs: opt.apply(gs, vs))
    for gs in grads:
        step([tf.constant(g) for g in gs])
    return [v.numpy() for v in vs]


LARS_CASES = {
    "momentum": dict(momentum=0.9),
    "no_momentum": dict(momentum=0.0),
    "nesterov": dict(momentum=0.9, nesterov=True),
    "decay": dict(momentum=0.9, weight_decay_rate=0.01),
    "decay_excluded": dict(momentum=0.9, weight_decay_rate=0.01, exclude_from_weight_decay=["bias", "gamma"],
                           exclude_from_layer_adaptation=["gamma"]),
    "predicate": dict(momentum=0.9, weight_decay_rate=0.01, eeta=0.01,
                      exclude_from_layer_adaptation=lambda v: len(v.shape) == 1),
}


def _masks(kw):
    paths = ["dense/kernel", "dense/bias", "conv/kernel", "bn/gamma", "out/kernel"]

    def excluded(spec, i):
        if spec is None:
            return False
        if callable(spec):
            return len(SHAPES[i]) == 1
        return any(p in paths[i] for p in spec)
    return ([not excluded(kw.get("exclude_from_weight_decay"), i) for i in range(len(SHAPES))],
            [not excluded(kw.get("exclude_from_layer_adaptation"), i) for i in range(len(SHAPES))])


@pytest.mark.parametrize("case", sorted(LARS_CASES))
@pytest.mark.parametrize("graph", [False, True])
def test_lars_equals_numpy_eq11(case, graph):
    kw = LARS_CASES[case]
    weights, grads = problem()
    got = run(pto.LARS(0.5, **kw), weights, grads, graph)
    decayed, adapted = _masks(kw)
    args = {k: v for k, v in kw.items() if not k.startswith("exclude")}
    want = ref.lars(weights, grads, 0.5, decayed=decayed, adapted=adapted, **args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
    # every variable with a gradient moved (the comparison would not tell a no-op from a tiny step)
    assert all(np.abs(got[i] - weights[i]).max() > 1e-5 for i in range(4))


def test_lars_variants_differ():
    """The cases above are told apart by the 1e-6 comparison."""
    weights, grads = problem()
    outs = {c: np.concatenate([w.ravel() for w in run(pto.LARS(0.5, **kw), weights, grads)])
            for c, kw in LARS_CASES.items()}
    names = sorted(outs)
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            assert np.abs(outs[names[a]] - outs[names[b]]).max() > 1e-5, (names[a], names[b])


@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.01), dict(beta_1=0.8, epsilon=1e-3)])
def test_lamb_equals_numpy_and_keras_lamb(kw):
    weights, grads = problem(1)
    want = ref.lamb(weights, grads, 0.01, **kw)
    mine = run(pto.LAMB(0.01, pto=False, **kw), weights, grads)
    keras_lamb = run(keras.optimizers.Lamb(0.01, **kw), weights, grads)
    graph = run(pto.LAMB(0.01, **kw), weights, grads, graph=True)
    for a, b, c, w in zip(mine, keras_lamb, graph, want):
        np.testing.assert_allclose(a, w, rtol=0, atol=1e-6)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(a, c)


def test_pto_flag_gives_same_bits_on_one_rank():
    weights, grads = problem(2)
    for make in (lambda p: pto.LARS(0.5, weight_decay_rate=0.01, pto=p), lambda p: pto.LAMB(0.01, pto=p)):
        on, off = run(make(True), weights, grads, True), run(make(False), weights, grads, True)
        for a, b in zip(on, off):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("make,message", [
    (lambda: pto.LARS(-0.1), "learning_rate must be a number >= 0"),
    (lambda: pto.LARS(0.1, weight_decay_rate=-1e-4), "weight_decay_rate must be a number >= 0"),
    (lambda: pto.LARS(0.1, momentum=-0.9), "momentum must be a number >= 0"),
    (lambda: pto.LARS(0.1, momentum=1.5), r"momentum must be in \[0, 1\]"),
    (lambda: pto.LARS(0.1, eeta=-1), "eeta must be a number >= 0"),
    (lambda: pto.LARS(0.1, exclude_from_weight_decay=[3]), "exclude_from_weight_decay must be None"),
    (lambda: pto.LARS(0.1, exclude_from_layer_adaptation=7), "exclude_from_layer_adaptation must be None"),
    (lambda: pto.LARS(0.1, exclude_from_weight_decay=["bias("]), "not a regular expression"),
    (lambda: pto.LAMB(-0.01), "learning_rate must be a number >= 0"),
    (lambda: pto.LAMB(0.01, weight_decay=-0.1), "weight_decay must be a number >= 0"),
    (lambda: pto.LAMB(0.01, beta_1=1.0), r"beta_1 must be in \[0, 1\)"),
    (lambda: pto.LAMB(0.01, epsilon=-1.0), "epsilon must be a number >= 0"),
])
def test_bad_arguments_raise(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("arg", ["exclude_from_weight_decay", "exclude_from_layer_adaptation"])
def test_unknown_exclusion_pattern_raises_at_build(arg):
    """A pattern that matches no variable (a typo) would silently exclude nothing."""
    weights, grads = problem()
    with pytest.raises(ValueError, match=rf"{arg}: pattern 'bais' matches no variable"):
        run(pto.LARS(0.5, weight_decay_rate=0.01, **{arg: ["bias", "bais"]}), weights, grads[:1])


@pytest.mark.parametrize("make", [lambda: pto.LARS(0.5, weight_decay_rate=0.01, nesterov=True),
                                  lambda: pto.LAMB(0.01, weight_decay=0.01)], ids=["lars", "lamb"])
def test_checkpoint_keeps_state(make, tmp_path):
    """tf.train.Checkpoint after 2 of 4 steps, restored into a fresh optimizer: the same weights as
    4 uninterrupted steps (momentum / moments and the iteration count are in the checkpoint)."""
    weights, grads = problem(5)
    full = run(make(), weights, grads)
    vs, opt = [keras.Variable(w) for w in weights], make()
    for gs in grads[:2]:
        opt.apply([tf.constant(g) for g in gs], vs)
    path = tf.train.Checkpoint(vars=vs, optimizer=opt).save(str(tmp_path / "ckpt"))
    vs2, opt2 = [keras.Variable(np.zeros_like(w)) for w in weights], make()
    opt2.build(vs2)
    tf.train.Checkpoint(vars=vs2, optimizer=opt2).restore(path).assert_consumed()
    assert int(opt2.iterations) == 2
    for gs in grads[2:]:
        opt2.apply([tf.constant(g) for g in gs], vs2)
    for a, b in zip(vs2, full):
        np.testing.assert_array_equal(a.numpy(), b)
    fresh = run(make(), [v.numpy() for v in vs], grads[2:])   # without the state: different
    assert max(np.abs(a - b).max() for a, b in zip(fresh, full)) > 1e-5


def test_serialisation_round_trip():
    opt = pto.LARS(0.3, momentum=0.8, weight_decay_rate=1e-4, eeta=0.002, nesterov=True,
                   exclude_from_weight_decay=["bias"], exclude_from_layer_adaptation="gamma", pto=False)
    back = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert type(back) is pto.LARS
    for key in ("momentum", "weight_decay_rate", "eeta", "nesterov", "pto"):
        assert getattr(back, key) == getattr(opt, key)
    assert back.decay_exclusions == ["bias"] and back.adaptation_exclusions == ["gamma"]
    lamb = keras.optimizers.deserialize(keras.optimizers.serialize(pto.LAMB(0.02, beta_2=0.99, weight_decay=0.1)))
    assert type(lamb) is pto.LAMB and lamb.beta_2 == 0.99 and lamb.weight_decay == 0.1
    with pytest.raises(NotImplementedError, match="predicate"):
        pto.LARS(0.1, exclude_from_layer_adaptation=lambda v: True).get_config()


def test_model_save_keeps_lars_state(tmp_path):
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((64, 8)).astype(np.float32), rng.integers(0, 3, 64)

    def model():
        keras.utils.set_random_seed(4)
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(3)])
        m.compile(pto.LARS(1.0, weight_decay_rate=1e-4, exclude_from_weight_decay=["bias", "gamma", "beta"]),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    full, part = model(), model()
    full.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    part.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    part.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert type(loaded.optimizer) is pto.LARS
    assert any(np.abs(v.numpy()).sum() > 0 for v in loaded.optimizer.velocities)
    loaded.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(loaded.weights, full.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)


def test_partition_is_balanced_and_deterministic():
    costs = [100, 1, 50, 50, 7, 7, 0, 30]
    parts = pto.partition(costs, 3)
    assert parts == pto.partition(list(costs), 3)
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))
    assert all(p == sorted(p) for p in parts)
    loads = [sum(costs[i] for i in p) for p in parts]
    assert loads == [100, 80, 65]   # LPT: 100 | 50 30 | 50 7 7 1 0
    assert pto.partition([5], 4) == [[0], [], [], []]


def test_parallel_map_without_horovod_is_local():
    xs = [tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3)), (tf.ones([2]), tf.zeros([1], tf.int32))]
    out = pto.parallel_map(lambda e: tf.reduce_sum(e) if not isinstance(e, tuple) else e[1], xs)
    assert float(out[0]) == 15.0 and out[1].numpy().tolist() == [0]
    np.testing.assert_array_equal(pto.parallel_elementwise(tf.sqrt, tf.constant([4.0, 9.0])), [2.0, 3.0])
