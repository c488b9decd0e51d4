"""Top-k selectors against the numpy references in tests/reference.py."""
import numpy as np
import pytest
import tensorflow as tf

from tests import reference as ref
from tf_commlib import ops

BF16 = tf.bfloat16.as_numpy_dtype


def gaussian(d, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(d).astype(dtype)


def check_mstopk(x, k, num_samplings=30, seed=7):
    values, indices, thresholds, counts = ops.mstopk_with_stats(x, k, num_samplings, seed=seed)
    idx, t1, t2, k1, k2, start = ref.mstopk(x, k, num_samplings, seed)
    assert indices.numpy().tolist() == idx.tolist()
    assert thresholds.numpy()[:2].tolist() == [t1, t2]  # identical, not close
    assert counts.numpy()[:3].tolist() == [k1, k2, start]
    flat = np.asarray(x).ravel()
    expect = flat[idx]
    np.testing.assert_array_equal(values.numpy(), np.where(np.isnan(expect), 0, expect))
    assert len(idx) == min(k, flat.size)


@pytest.mark.parametrize("d,k", [(1, 1), (100, 7), (20_000, 20), (1_000_003, 1000), (300_000, 150_000)])
@pytest.mark.parametrize("num_samplings", [1, 5, 12, 13, 30])
def test_mstopk_equals_algorithm_1(d, k, num_samplings):
    check_mstopk(gaussian(d, seed=d + k), k, num_samplings)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_mstopk_half_types(dtype):
    check_mstopk(gaussian(50_000, 3, dtype), 50)


def test_mstopk_distributions_and_shapes():
    rng = np.random.default_rng(5)
    check_mstopk(rng.exponential(size=(300, 700)).astype(np.float32), 210)   # any shape, flat
    check_mstopk(rng.standard_cauchy(400_000).astype(np.float32), 400)       # heavy tail
    check_mstopk(rng.integers(-3, 4, 200_000).astype(np.float32), 1000)      # heavy ties


def test_mstopk_recall_on_gaussian():
    x = gaussian(2_000_000, 11)
    values, _ = ops.mstopk(x, 2000, seed=1)
    exact = np.sort(x.astype(np.float64) ** 2)[-2000:].sum()
    assert np.sum(values.numpy().astype(np.float64) ** 2) / exact >= 0.95


def test_mstopk_seed_moves_only_the_band():
    x = np.random.default_rng(2).integers(0, 3, 100_000).astype(np.float32)  # wide band of ties
    runs = {tuple(ops.mstopk(x, 500, seed=s)[1].numpy()) for s in range(5)}
    assert len(runs) > 1
    for s in range(5):
        check_mstopk(x, 500, seed=s)


@pytest.mark.parametrize("case", ["k_ge_size", "all_equal", "zeros", "inf", "many_inf", "one"])
def test_mstopk_edge_cases(case):
    x = gaussian(10_000, 1)
    k = 10
    if case == "k_ge_size":
        k = 20_000
    elif case == "all_equal":
        x = np.full(10_000, -2.5, np.float32)
    elif case == "zeros":
        x = np.zeros(10_000, np.float32)
    elif case == "inf":
        x[[5, 77, 9000]] = [np.inf, -np.inf, np.inf]
    elif case == "many_inf":
        x[::100] = np.inf
    elif case == "one":
        x, k = np.array(3.0, np.float32), 1
    check_mstopk(x, k)
    _, indices = ops.mstopk(x, k)
    assert len(set(indices.numpy().tolist())) == min(k, np.size(x))
    if case == "inf":
        assert {5, 77, 9000} <= set(indices.numpy().tolist())


def test_nan_raises_by_default_and_reads_as_zero_when_allowed():
    x = gaussian(1000)
    x[[3, 4]] = np.nan
    for f in (ops.mstopk, ops.trimmed_topk, ops.dgc_topk):
        with pytest.raises(tf.errors.InvalidArgumentError, match="x contains 2 NaN values"):
            f(x, 10)
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN"):
        ops.threshold_search(x, 10)
    values, indices, _, _ = ops.mstopk_with_stats(x, 10, seed=7, allow_nan=True)
    idx, *_ = ref.mstopk(x, 10, seed=7)
    assert indices.numpy().tolist() == idx.tolist()
    assert not np.isnan(values.numpy()).any()


@pytest.mark.parametrize("name", list(ops.SELECTORS))
def test_bad_input_names_the_argument(name):
    f = ops.SELECTORS[name]
    with pytest.raises(tf.errors.InvalidArgumentError, match="k must be positive, got 0"):
        f(gaussian(10), 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="k must be positive, got -2"):
        f(gaussian(10), -2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="x must be float32.*int32"):
        f(np.arange(10, dtype=np.int32), 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="scalar \\(rank 0\\) but k = 2"):
        f(np.float32(1.0), 2)


def test_empty_x_gives_an_empty_selection():
    values, indices, thresholds, counts = ops.mstopk_with_stats(np.zeros(0, np.float32), 1)
    assert values.shape == (0,) and indices.shape == (0,)
    assert thresholds.numpy().tolist() == [0.0] * 4 and counts.numpy().tolist() == [0] * 4


def test_k_as_tensor_inside_tf_function():
    f = tf.function(lambda x, k: ops.mstopk(x, k, seed=3))
    x = gaussian(30_000, 4)
    for k in (30, 300):
        _, idx = f(x, tf.constant(k, tf.int64))
        assert idx.numpy().tolist() == ref.mstopk(x, k, seed=3)[0].tolist()
    with pytest.raises(tf.errors.InvalidArgumentError, match="k must be positive, got 0"):
        f(x, tf.constant(0, tf.int64))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("name", ["exact_topk", "dgc_topk", "trimmed_topk"])
def test_exact_k_selectors_return_the_top_k(name, dtype):
    x = gaussian(200_000, 9, dtype)
    k = 200
    values, indices = ops.SELECTORS[name](x, k)
    got = np.sort(indices.numpy())
    assert len(got) == k and len(set(got)) == k
    np.testing.assert_array_equal(np.sort(np.abs(np.asarray(x, np.float32)[got])),
                                  np.sort(np.abs(np.asarray(x, np.float32)[ref.exact_topk_indices(x, k)])))
    np.testing.assert_array_equal(values.numpy(), x[indices.numpy()])


def test_trimmed_topk_threshold_and_fallbacks():
    x = gaussian(100_000, 2)
    for k in (10, 5000, 60_000):   # 60k: more than pass the mean, falls back to every entry
        _, idx = ops.trimmed_topk(x, k)
        assert sorted(idx.numpy().tolist()) == sorted(ref.exact_topk_indices(x, k).tolist())
    t = ref.trimmed_topk_threshold(x, 5000)
    assert np.count_nonzero(np.abs(x) >= t) >= 5000


def test_dgc_topk_falls_back_when_the_sample_misleads():
    x = np.zeros(100_000, np.float32)
    x[:50] = np.arange(1, 51)  # the sample almost surely sees only zeros
    _, idx = ops.dgc_topk(x, 50, sample_ratio=0.01, seed=1)
    assert sorted(idx.numpy().tolist()) == list(range(50))


@pytest.mark.parametrize("d,k", [(100_000, 100), (1_000_000, 5000), (50, 49), (1000, 1000)])
def test_threshold_search_window(d, k):
    x = gaussian(d, d)
    values, indices, threshold = ops.threshold_search(x, k)
    t = ref.threshold_search(x, k)
    assert threshold.numpy() == t
    expect = np.flatnonzero(np.abs(x).astype(np.float64) >= t)
    assert indices.numpy().tolist() == expect.tolist()
    if k < d:
        assert k <= len(expect) < 2 * k
    # reuse the threshold on the next step's gradient
    y = gaussian(d, d + 1)
    v2, i2 = ops.threshold_select(y, threshold)
    assert i2.numpy().tolist() == np.flatnonzero(np.abs(y).astype(np.float64) >= t).tolist()
    np.testing.assert_array_equal(v2.numpy(), y[i2.numpy()])


def test_threshold_search_all_equal_returns_everything_it_must():
    x = np.ones(1000, np.float32)
    _, idx, t = ops.threshold_search(x, 10)
    assert t.numpy() == ref.threshold_search(x, 10) and len(idx) == 1000


def test_randomk_uniform_distinct_reproducible():
    x = gaussian(10_000)
    a = ops.randomk(x, 500, seed=4)[1].numpy()
    b = ops.randomk(x, 500, seed=4)[1].numpy()
    c = ops.randomk(x, 500, seed=5)[1].numpy()
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()
    assert len(set(a.tolist())) == 500 and a.min() >= 0 and a.max() < 10_000
    # uniform: over many draws every decile of the index range gets about 10 %
    draws = np.concatenate([ops.randomk(x, 500, seed=s)[1].numpy() for s in range(40)])
    deciles = np.bincount(draws // 1000, minlength=10) / len(draws)
    assert np.all(np.abs(deciles - 0.1) < 0.02)


def test_qrgc_alternates_sign_and_sends_the_mean():
    x = gaussian(1000, 8)
    v0, i0 = ops.qrgc(x, 10, step=0)
    v1, i1 = ops.qrgc(x, 10, step=1)
    assert sorted(i0.numpy().tolist()) == sorted(np.argsort(-x)[:10].tolist())   # largest
    assert sorted(i1.numpy().tolist()) == sorted(np.argsort(x)[:10].tolist())    # most negative
    np.testing.assert_allclose(v0.numpy(), np.full(10, x[i0.numpy()].mean()), rtol=1e-6)
    np.testing.assert_allclose(v1.numpy(), np.full(10, x[i1.numpy()].mean()), rtol=1e-6)
    assert v0.numpy()[0] > 0 > v1.numpy()[0]


def test_mstopk_when_the_pre_sample_misleads():
    # The strided pre-sample the kernel collects with sees only the planted 3.0s, so the
    # collected set starts exactly at the k-th value: the search ends among probes that only a
    # second, exact search can count (ops/topk/probe_engine.h).
    d = 1_000_000
    x = gaussian(d, 21)
    x[np.arange(4096) * d // 4096] = 3.0
    x[12345] = 10.0
    for k in (3000, 5000, 20_000):
        check_mstopk(x, k)
        values, indices, threshold = ops.threshold_search(x, k)
        assert threshold.numpy() == ref.threshold_search(x, k)


def test_selector_registry_picks_up_a_new_selector():
    """A selector registered with @ops.selector (in whatever module defines it) is known to the
    aggregator's check and to `bench topk` without editing a list; bound_selector passes the seed
    and step only to selectors that take them (qrgc its step)."""
    from tf_commlib.aggregator import check_config
    from tfc_apps.bench import topk
    assert {"mstopk", "qrgc", "threshold_search"} <= set(topk.methods(3)) - {"tf_topk", "one_pass"}
    calls = []

    @ops.selector("first_k_for_test", seeded=True)
    def first_k(x, k, seed=None):
        calls.append(seed)
        return tf.reshape(x, [-1])[:k], tf.range(k)
    try:
        assert ops.SELECTORS["first_k_for_test"] is first_k
        check_config("naive_ag", 0.1, "first_k_for_test")
        assert "first_k_for_test" in topk.methods(3)
        values, _ = topk.methods(3, seed=5)["first_k_for_test"](tf.range(10.0))
        assert values.numpy().tolist() == [0.0, 1.0, 2.0] and calls == [5]
        with pytest.raises(ValueError, match="already registered"):
            ops.selector("first_k_for_test")(first_k)
    finally:
        del ops.SELECTORS["first_k_for_test"]
    x = gaussian(100, 3)
    for step in (0, 1):
        np.testing.assert_array_equal(ops.bound_selector("qrgc", seed=9, step=step)(x, 5)[1],
                                      ops.qrgc(x, 5, step=step)[1])
    assert ops.bound_selector("exact_topk", seed=9, step=1) is ops.exact_topk
