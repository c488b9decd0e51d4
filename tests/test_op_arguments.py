"""Bad arguments of every op raise InvalidArgumentError naming the argument (eagerly, in a
tf.function, and in a graph whose input shapes are only known when it runs), never abort; k = 0
in any form is the same error; an empty x gives an empty selection; one NaN/Inf policy for all
selectors."""
import functools

import numpy as np
import pytest
import tensorflow as tf

from tests import reference as ref
from tf_commlib import ops
from tf_commlib._loader import ops as raw

X = np.random.default_rng(0).standard_normal(64).astype(np.float32)
ONE = np.ones(1, np.float32)
SEEDED = {"mstopk": {"seed": 3}, "dgc_topk": {"seed": 3}, "randomk": {"seed": 3}}


def selector(name, **kw):
    return functools.partial(ops.SELECTORS[name], **SEEDED.get(name, {}), **kw)


# (op, argument, call with the argument's value, a value of the wrong rank, expected rank word)
TENSOR_ARGS = [
    ("mstopk", "k", lambda v: ops.mstopk(X, v, seed=1), [1, 2], "scalar"),
    ("mstopk", "seed", lambda v: ops.mstopk(X, 4, seed=v), [1, 2], "scalar"),
    ("mstopk", "k", lambda v: ops.mstopk_with_stats(X, v), [[3]], "scalar"),
    ("threshold_search", "k", lambda v: ops.threshold_search(X, v), [1, 2], "scalar"),
    ("threshold_select", "threshold", lambda v: ops.threshold_select(X, v), [1.0, 2.0], "scalar"),
    ("exact_topk", "k", lambda v: ops.exact_topk(X, v), [1, 2], "scalar"),
    ("trimmed_topk", "k", lambda v: ops.trimmed_topk(X, v), [1, 2], "scalar"),
    ("dgc_topk", "k", lambda v: ops.dgc_topk(X, v, seed=1), [1, 2], "scalar"),
    ("dgc_topk", "seed", lambda v: ops.dgc_topk(X, 4, seed=v), [1, 2], "scalar"),
    ("randomk", "k", lambda v: ops.randomk(X, v, seed=1), [1, 2], "scalar"),
    ("randomk", "seed", lambda v: ops.randomk(X, 4, seed=v), [1, 2], "scalar"),
    ("qrgc", "k", lambda v: ops.qrgc(X, v), [1, 2], "scalar"),
    ("qrgc", "step", lambda v: ops.qrgc(X, 4, step=v), [1, 2], "scalar"),
    ("scatter_add", "size", lambda v: ops.scatter_add([0], ONE, v), [3, 4], "scalar"),
    ("scatter_add", "indices", lambda v: ops.scatter_add(v, ONE, 4), [[0]], "vector"),
    ("scatter_add", "values", lambda v: ops.scatter_add([0], v, 4), np.ones((1, 1), np.float32),
     "vector"),
]
IDS = [f"{op}-{arg}-{np.ndim(bad)}d" for op, arg, _, bad, _ in TENSOR_ARGS]


@pytest.mark.parametrize("mode", ["eager", "function", "function_unknown_shape"])
@pytest.mark.parametrize("op,arg,call,bad,rank", TENSOR_ARGS, ids=IDS)
def test_wrong_rank_names_the_argument(op, arg, call, bad, rank, mode):
    bad = np.asarray(bad)
    shape = bad.shape if mode == "function" else None
    run = call
    if mode != "eager":
        run = tf.function(call, input_signature=[tf.TensorSpec(shape, tf.as_dtype(bad.dtype))])
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{op}: {arg} must be a {rank}"):
        tf.nest.map_structure(lambda t: t.numpy(), run(bad))


# The kernels themselves (the raw ops, no Python checks): the former SIGABRT cases.
I64 = np.array([1, 2], np.int64)
RAW = [
    ("mstopk", "k", lambda: raw.commlib_mstopk(X, I64, np.int64(1))),
    ("mstopk", "seed", lambda: raw.commlib_mstopk(X, np.int64(2), I64)),
    ("threshold_search", "k", lambda: raw.commlib_threshold_search(X, I64)),
    ("threshold_select", "threshold", lambda: raw.commlib_threshold_select(X, [1.0, 2.0])),
    ("ratio_counts", "ratios", lambda: raw.commlib_ratio_counts(X, np.float64(0.5))),
    ("exact_topk", "k", lambda: raw.commlib_check_selection(X, I64, op_name="exact_topk")),
    ("scatter_add", "size", lambda: raw.commlib_scatter_add([0], ONE, I64)),
    ("scatter_add", "indices", lambda: raw.commlib_scatter_add([[0]], ONE, np.int64(4))),
    ("scatter_add", "values", lambda: raw.commlib_scatter_add([0], ONE[None], np.int64(4))),
    ("zero_at", "indices", lambda: raw.commlib_zero_at(tf.Variable(ONE).handle, [[0]], dtype=tf.float32)),
]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("op,arg,call", RAW, ids=[f"{o}-{a}" for o, a, _ in RAW])
def test_kernels_and_shape_functions_name_the_argument(op, arg, call, graph):
    run = tf.function(call) if graph else call
    # A graph reports a shape-function error as ValueError while it is being built.
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=f"{op}: {arg} must be a"):
        run()


PY_ARGS = [
    ("mstopk", "num_samplings", lambda v: ops.mstopk(X, 4, num_samplings=v), [[3], 0, 53, 2.5, True]),
    ("dgc_topk", "sample_ratio", lambda v: ops.dgc_topk(X, 4, sample_ratio=v), [[0.1], 0, 1.5, "a"]),
    ("mstopk", "k", lambda v: ops.mstopk(X, v), [2.5, True, "3", np.float32(2)]),
    ("exact_topk", "k", lambda v: ops.exact_topk(X, v), [2.5, True, tf.constant(2.0)]),
    ("threshold_select", "threshold", lambda v: ops.threshold_select(X, v), [True, "1"]),
    ("randomk", "seed", lambda v: ops.randomk(X, 4, seed=v), [1.5, True]),
    ("scatter_add", "size", lambda v: ops.scatter_add([0], ONE, v), [4.0, False]),
] + [(name, "allow_nan", lambda v, name=name: getattr(ops, name)(X, 4, allow_nan=v), [[True], 1, "no"])
     for name in ("mstopk", "threshold_search", "exact_topk", "trimmed_topk", "dgc_topk", "randomk",
                  "qrgc")] + [
    ("threshold_select", "allow_nan", lambda v: ops.threshold_select(X, 1.0, allow_nan=v), [[True]]),
]


@pytest.mark.parametrize("op,arg,call,bads", PY_ARGS, ids=[f"{o}-{a}" for o, a, _, _ in PY_ARGS])
def test_wrong_type_or_range_names_the_argument(op, arg, call, bads):
    for bad in bads:
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"{op}: {arg} must be"):
            call(bad)


ZEROS = {"python": lambda: 0, "np.int64": lambda: np.int64(0), "np.int32": lambda: np.int32(0),
         "tensor": lambda: tf.constant(0, tf.int64), "tensor32": lambda: tf.constant(0)}


@pytest.mark.parametrize("name", list(ops.SELECTORS))
def test_k_zero_is_the_same_error_in_every_form(name):
    f = selector(name)
    for form, zero in ZEROS.items():
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"{name}: k must be positive, got 0"):
            f(X, zero())
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{name}: k must be positive, got -3"):
        f(X, np.int64(-3))
    g = tf.function(lambda k: f(X, k), input_signature=[tf.TensorSpec([], tf.int64)])
    for k in (0, -3):  # known only when the graph runs: the kernels check it
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"{name}: k must be positive, got {k}"):
            tf.nest.map_structure(lambda t: t.numpy(), g(tf.constant(k, tf.int64)))
    values, indices = g(tf.constant(5, tf.int64))
    # exactly k out, except threshold_search: every |x| >= its threshold, k <= count < 2k (RedSync)
    expect = 5
    if name == "threshold_search":
        expect = np.count_nonzero(np.abs(X).astype(np.float64) >= ref.threshold_search(X, 5))
        assert 5 <= expect < 10
    assert [len(values), len(indices)] == [expect, expect]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "function_unknown_shape"])
@pytest.mark.parametrize("name", list(ops.SELECTORS))
def test_empty_x_gives_an_empty_selection(name, graph):
    f = selector(name)
    if graph:
        f = tf.function(f, input_signature=[tf.TensorSpec(None, tf.float32), tf.TensorSpec([], tf.int64)])
    for k in (1, 7):
        values, indices = f(np.zeros((0,), np.float32), np.int64(k))
        assert values.shape == (0,) and values.dtype == tf.float32
        assert indices.shape == (0,) and indices.dtype == tf.int32
    values, indices = ops.threshold_select(np.zeros((3, 0), np.float16), 0.0)
    assert values.shape == (0,) and values.dtype == tf.float16 and indices.shape == (0,)


def with_nan():
    x = X.copy()
    x[[3, 40]] = np.nan
    return x


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("name", list(ops.SELECTORS) + ["threshold_select"])
def test_nan_raises_in_every_selector(name, graph):
    op = "threshold_search" if name == "threshold_search" else name
    f = (lambda x: ops.threshold_select(x, 0.5)) if name == "threshold_select" else \
        (lambda x: selector(name)(x, 4))
    if graph:
        f = tf.function(f)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{op}: x contains 2 NaN values"):
        tf.nest.map_structure(lambda t: t.numpy(), f(with_nan()))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", list(ops.SELECTORS) + ["threshold_select"])
def test_allow_nan_reads_nan_as_zero_in_every_selector(name, dtype):
    x = with_nan().astype(dtype)
    zeroed = np.where(np.isnan(x), 0, x).astype(dtype)
    if name == "threshold_select":
        got, want = ops.threshold_select(x, 0.5, allow_nan=True), ops.threshold_select(zeroed, 0.5)
    else:
        got, want = selector(name, allow_nan=True)(x, 8), selector(name)(zeroed, 8)
    order = np.argsort(got[1].numpy())
    np.testing.assert_array_equal(got[1].numpy()[order], np.sort(want[1].numpy()))
    np.testing.assert_array_equal(got[0].numpy()[order], want[0].numpy()[np.argsort(want[1].numpy())])
    assert not np.isnan(got[0].numpy()).any()


@pytest.mark.parametrize("name", ["mstopk", "exact_topk", "trimmed_topk", "dgc_topk",
                                  "threshold_search"])
def test_inf_counts_as_the_largest_magnitude(name):
    x = X.copy()
    x[[5, 9]] = [np.inf, -np.inf]
    values, indices = selector(name)(x, 4)
    assert {5, 9} <= set(indices.numpy().tolist())
    assert np.isinf(values.numpy()).sum() == 2


def test_inf_in_qrgc_and_randomk():
    x = X.copy()
    x[[5, 9]] = [np.inf, -np.inf]
    assert 5 in ops.qrgc(x, 4, step=0)[1].numpy().tolist()   # +Inf is the largest
    assert 9 in ops.qrgc(x, 4, step=1)[1].numpy().tolist()   # -Inf the most negative
    values, indices = ops.randomk(x, 64, seed=1)             # every entry, Inf passed through
    np.testing.assert_array_equal(values.numpy(), x[indices.numpy()])
