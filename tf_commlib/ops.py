"""Python API of the custom ops: sparse decompression (scatter_add), in-place zeroing of a variable
(zero_at) and the top-k selectors.

Every selector takes ``x`` of any shape (read flat; float32/float16/bfloat16) and a positive
integer ``k`` (Python/numpy int or integer scalar tensor), and returns exactly min(k, size) entries
as (values, indices): an empty x gives an empty selection. NaN in x raises InvalidArgumentError
unless ``allow_nan=True``, which reads NaN as 0 (its value is returned as 0); ±Inf count as the
largest magnitudes. Bad arguments raise InvalidArgumentError naming the argument, eagerly and in
graphs (the kernels check what is only known at run time).
"""
import numbers

import numpy as np
import tensorflow as tf

from tf_commlib._loader import ops as _ops

FLOAT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


SELECTORS = {}   # name -> selector(x, k, ...): every function registered with @selector


def selector(name, seeded=False, stepped=False):
    """Registers the decorated function as the top-k selector `name` (GradientAggregator(selector=
    name), DistributedOptimizer, `bench topk`): fn(x, k, ...) -> (values, indices); seeded: it takes
    ``seed=`` (the aggregator passes its per-bucket seed), stepped: it takes ``step=`` (the
    aggregator's step). ValueError if the name is taken."""
    def add(fn):
        if name in SELECTORS:
            raise ValueError(f"a selector named {name!r} is already registered")
        fn.seeded, fn.stepped = seeded, stepped
        SELECTORS[name] = fn
        return fn
    return add


def bound_selector(name, seed=None, step=None):
    """The selector `name` as select(x, k), with seed and step passed where it takes them."""
    fn = SELECTORS[name]
    kw = {**({"seed": seed} if fn.seeded and seed is not None else {}),
          **({"step": step} if fn.stepped and step is not None else {})}
    return (lambda x, k: fn(x, k, **kw)) if kw else fn


def _invalid(msg):
    return tf.errors.InvalidArgumentError(None, None, msg)


def _shape_str(shape):
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def check_float(x, name):
    """Converts x to a tensor and checks it holds float32/float16/bfloat16."""
    x = tf.convert_to_tensor(x)
    if x.dtype not in FLOAT_DTYPES:
        raise _invalid(f"{name} must be float32, float16 or bfloat16, got {x.dtype.name}")
    return x


def _scalar(v, name, op, integer):
    """v as an int64 (integer) or float64 scalar tensor; raises naming `name` if it is not one."""
    if isinstance(v, (bool, np.bool_)) or (integer and isinstance(v, (float, np.floating))):
        raise _invalid(f"{op}: {name} must be {'an integer' if integer else 'a number'}, got {v!r}")
    try:
        t = tf.convert_to_tensor(v)
    except (ValueError, TypeError) as e:
        raise _invalid(f"{op}: {name} must be a scalar, got {v!r} ({e})") from None
    if not (t.dtype.is_integer or (not integer and t.dtype.is_floating)):
        raise _invalid(f"{op}: {name} must be {'an integer' if integer else 'a number'}, "
                       f"got {t.dtype.name}")
    if t.shape.rank is not None and t.shape.rank != 0:
        raise _invalid(f"{op}: {name} must be a scalar, got shape {_shape_str(t.shape)}")
    if t.shape.rank is None:  # a graph input of unknown shape: checked when the graph runs
        with tf.control_dependencies(
                [tf.debugging.assert_rank(t, 0, message=f"{op}: {name} must be a scalar")]):
            # a static scalar that no shape function rejects when the function is instantiated
            # with the real (wrong) shape, so that the assert above is what reports it
            t = tf.gather(tf.reshape(t, [-1]), 0)
    return tf.cast(t, tf.int64 if integer else tf.float64)


def _flag(v, name, op):
    """v as a Python bool; raises naming `name` unless it is True or False."""
    if not isinstance(v, (bool, np.bool_)):
        raise _invalid(f"{op}: {name} must be True or False, got {v!r}")
    return bool(v)


def _vector(t, name, op):
    if t.shape.rank is not None and t.shape.rank != 1:
        raise _invalid(f"{op}: {name} must be a vector, got shape {_shape_str(t.shape)}")
    return t


def scatter_add(indices, values, size):
    """Dense vector of length ``size`` with ``values`` added at ``indices`` (repeats are summed).

    This is the decompression step of every sparse collective. ``indices`` is an int32 or int64
    vector, ``values`` a float32/float16/bfloat16 vector of the same length, ``size`` a
    non-negative integer scalar; out-of-range indices raise.
    """
    values = _vector(check_float(values, "values"), "values", "scatter_add")
    indices = tf.convert_to_tensor(indices)
    if indices.dtype not in (tf.int32, tf.int64):
        raise _invalid(f"indices must be int32 or int64, got {indices.dtype.name}")
    _vector(indices, "indices", "scatter_add")
    size = _scalar(size, "size", "scatter_add", integer=True)
    static = tf.get_static_value(size)
    if static is not None and static < 0:
        raise _invalid(f"scatter_add: size must be non-negative, got {static}")
    return _ops.commlib_scatter_add(indices, values, size)


def zero_at(variable, indices):
    """Sets the tf.Variable to 0 at ``indices`` (int32/int64 flat, row-major; repeats allowed) in
    place: O(len(indices)). TensorFlow's scatter ops switch a variable to copy-on-read, after which
    every read copies it whole (DGC's momentum masking cost ~0.3 s per ResNet-50 step that way). A
    variable that is not on the CPU goes through scatter_nd_update. Out-of-range indices raise."""
    indices = tf.convert_to_tensor(indices)
    if indices.dtype not in (tf.int32, tf.int64):
        raise _invalid(f"zero_at: indices must be int32 or int64, got {indices.dtype.name}")
    _vector(indices, "indices", "zero_at")
    if variable.dtype not in FLOAT_DTYPES + (tf.float64,):
        raise _invalid(f"zero_at: variable must be a float variable, got {variable.dtype.name}")
    on_cpu = "GPU" not in variable.device.upper() and not tf.config.list_logical_devices("GPU")
    if on_cpu:
        _ops.commlib_zero_at(variable.handle, indices, dtype=variable.dtype)
        return
    dims = variable.shape.as_list()
    strides = [int(np.prod(dims[j + 1:], dtype=np.int64)) for j in range(len(dims))]
    where = tf.cast(indices, tf.int64)[:, None] // strides % dims if dims else tf.zeros([tf.size(indices), 0], tf.int64)
    variable.scatter_nd_update(where, tf.zeros(tf.shape(indices), variable.dtype))


def _prepare(x, k, name):
    """Checks x (dtype) and k (a positive integer scalar; run-time values are checked by the
    kernels), and picks the index dtype. Returns (x, k as int64, index dtype)."""
    x = check_float(x, "x")
    k = _scalar(k, "k", name, integer=True)
    static = tf.get_static_value(k)
    if static is not None:
        if static <= 0:
            raise _invalid(f"{name}: k must be positive, got {static}")
        if x.shape.rank == 0 and static > 1:
            raise _invalid(f"{name}: x is a scalar (rank 0) but k = {static}")
    size = x.shape.num_elements()
    tidx = tf.int64 if size is not None and size >= 2**31 else tf.int32
    return x, k, tidx


def _checked(x, k, name, allow_nan):
    """_prepare plus the kernel-side checks (k, NaN); returns (flat x, n = min(k, size), tidx)."""
    x, k, tidx = _prepare(x, k, name)
    n = _ops.commlib_check_selection(x, k, op_name=name,
                                     allow_nan=_flag(allow_nan, "allow_nan", name))
    with tf.control_dependencies([n]):  # in a graph too, nothing reads x before the checks
        return tf.reshape(x, [-1]), n, tidx


def _nan_to_zero(v):
    return tf.where(tf.math.is_nan(v), tf.zeros_like(v), v)


def _seed(seed, name):
    return tf.constant(-1, tf.int64) if seed is None else _scalar(seed, "seed", name, integer=True)


@selector("mstopk", seeded=True)
def mstopk(x, k, num_samplings=30, seed=None, allow_nan=False):
    """MSTopK (shi2021 Alg. 1): exactly min(k, size) entries of flat x, as (values, indices).

    All entries with |x| >= thres1 come first (index order), then a contiguous run, starting at a
    random position (reproducible with ``seed``), of the band thres2 <= |x| < thres1.
    ±Inf count as the largest; NaN raises unless ``allow_nan``, which reads it as 0.
    """
    return mstopk_with_stats(x, k, num_samplings, seed, allow_nan)[:2]


def mstopk_with_stats(x, k, num_samplings=30, seed=None, allow_nan=False):
    """mstopk plus its internals: (values, indices, thresholds, counts) where
    thresholds = [thres1, thres2, mean, max] (float64) and counts = [k1, k2, band_start, n_inf]."""
    x, k, tidx = _prepare(x, k, "mstopk")
    if isinstance(num_samplings, (bool, np.bool_)) or not isinstance(num_samplings, numbers.Integral):
        raise _invalid(f"mstopk: num_samplings must be an integer, got {num_samplings!r}")
    if not 1 <= num_samplings <= 52:
        raise _invalid(f"mstopk: num_samplings must be in [1, 52], got {num_samplings}")
    return _ops.commlib_mstopk(x, k, _seed(seed, "mstopk"), Tidx=tidx,
                               num_samplings=int(num_samplings),
                               allow_nan=_flag(allow_nan, "allow_nan", "mstopk"))


def threshold_search(x, k, allow_nan=False):
    """RedSync Alg. 3 (corrected): (values, indices, threshold) with k <= count < 2k where ties allow."""
    x, k, tidx = _prepare(x, k, "threshold_search")
    return _ops.commlib_threshold_search(x, k, Tidx=tidx,
                                         allow_nan=_flag(allow_nan, "allow_nan", "threshold_search"))


def threshold_select(x, threshold, allow_nan=False):
    """Every entry with |x| >= threshold (a number), as (values, indices) in index order."""
    x = check_float(x, "x")
    threshold = _scalar(threshold, "threshold", "threshold_select", integer=False)
    tidx = tf.int64 if (x.shape.num_elements() or 0) >= 2**31 else tf.int32
    return _ops.commlib_threshold_select(x, threshold, Tidx=tidx,
                                         allow_nan=_flag(allow_nan, "allow_nan", "threshold_select"))


def _magnitudes(flat):
    """|x| as float32 (top_k on half types is slow or missing on some builds), NaN read as 0."""
    return _nan_to_zero(tf.abs(tf.cast(flat, tf.float32)))


def _top_magnitudes(flat, n, tidx):
    _, idx = tf.math.top_k(_magnitudes(flat), tf.cast(n, tf.int32), sorted=False)
    return _nan_to_zero(tf.gather(flat, idx)), tf.cast(idx, tidx)


@selector("exact_topk")
def exact_topk(x, k, allow_nan=False):
    """The exact k largest |x| (reference selector), as (values, indices)."""
    flat, n, tidx = _checked(x, k, "exact_topk", allow_nan)
    return _top_magnitudes(flat, n, tidx)


@selector("trimmed_topk")
def trimmed_topk(x, k, allow_nan=False):
    """RedSync Alg. 2 (corrected): threshold mean + ratio*(max - mean) for ratio 0.8, 0.6, ... 0
    (the first that at least k entries pass), then the exact top-k of those; exactly k out."""
    flat, n, tidx = _checked(x, k, "trimmed_topk", allow_nan)
    ratios = tf.constant([0.8, 0.6, 0.4, 0.2, 0.0], tf.float64)
    stats, counts = _ops.commlib_ratio_counts(flat, ratios, allow_nan=bool(allow_nan))
    ok = counts >= n
    first = tf.argmax(tf.cast(ok, tf.int32))  # first ratio with enough entries
    ratio = tf.where(tf.reduce_any(ok), tf.gather(ratios, first), tf.constant(-1.0, tf.float64))
    threshold = tf.where(ratio >= 0, stats[0] + ratio * (stats[1] - stats[0]), 0.0)
    values, indices = _ops.commlib_threshold_select(flat, threshold, Tidx=tidx,
                                                    allow_nan=bool(allow_nan))
    return _exact_among(values, indices, n)


def _exact_among(values, indices, n):
    """The n largest |values| among already selected candidates."""
    n = tf.minimum(n, tf.size(values, out_type=tf.int64))
    _, pos = tf.math.top_k(_magnitudes(values), tf.cast(n, tf.int32), sorted=False)
    return tf.gather(values, pos), tf.gather(indices, pos)


@selector("dgc_topk", seeded=True)
def dgc_topk(x, k, sample_ratio=0.01, seed=None, allow_nan=False):
    """DGC §5 selection: the top-k threshold of a random sample of |x|, the entries above it,
    and the exact top-k of those when more than k pass; exactly k out."""
    if (isinstance(sample_ratio, (bool, np.bool_)) or not isinstance(sample_ratio, numbers.Real)
            or not 0.0 < sample_ratio <= 1.0):
        raise _invalid(f"dgc_topk: sample_ratio must be a number in (0, 1], got {sample_ratio!r}")
    flat, k, tidx = _checked(x, k, "dgc_topk", allow_nan)
    d = tf.size(flat, out_type=tf.int64)
    n = tf.minimum(d, tf.maximum(tf.cast(tf.cast(d, tf.float64) * sample_ratio, tf.int64), 1000))
    seeds = tf.stack([_seed(seed, "dgc_topk"), tf.constant(0x5EED, tf.int64)])
    if seed is None:
        seeds = tf.random.uniform([2], 0, 2**31, tf.int64)
    pick = tf.random.stateless_uniform([n], seeds, 0, tf.maximum(d, 1), tf.int64)
    sample = _magnitudes(tf.gather(flat, pick))
    # The sample's top-(k n / d) threshold lets fewer than k through half the time; aim 25 % and
    # 3 standard deviations lower so the exact fallback is rare.
    expect = tf.cast(k * n, tf.float64) / tf.cast(tf.maximum(d, 1), tf.float64)
    ks = tf.cast(tf.math.ceil(1.25 * expect + 3.0 * tf.sqrt(expect)), tf.int32) + 1
    ks = tf.minimum(ks, tf.cast(n, tf.int32))
    threshold = tf.cast(tf.reduce_min(tf.math.top_k(sample, ks, sorted=False).values), tf.float64)
    values, indices = _ops.commlib_threshold_select(flat, threshold, Tidx=tidx,
                                                    allow_nan=bool(allow_nan))
    enough = tf.size(values, out_type=tf.int64) >= k
    return tf.cond(enough, lambda: _exact_among(values, indices, k),
                   lambda: _top_magnitudes(flat, k, tidx))


@selector("randomk", seeded=True)
def randomk(x, k, seed=None, allow_nan=False):
    """k distinct uniformly random entries of flat x (baseline), as (values, indices) sorted by index."""
    flat, k, tidx = _checked(x, k, "randomk", allow_nan)
    d = tf.size(flat, out_type=tf.int64)
    key = tf.stack([_seed(seed, "randomk"), tf.constant(0x4A4D, tf.int64)])
    if seed is None:
        key = tf.random.uniform([2], 0, 2**31, tf.int64)
    # index_shuffle refuses an empty index vector: shuffle at least one, keep k.
    drawn = tf.random.experimental.index_shuffle(tf.range(tf.maximum(k, 1)), key,
                                                 tf.maximum(d - 1, 0))
    idx = tf.sort(drawn[:k])
    return _nan_to_zero(tf.gather(flat, idx)), tf.cast(idx, tidx)


@selector("qrgc", stepped=True)
def qrgc(x, k, step=0, allow_nan=False):
    """RedSync's quantized selection: on even steps the k largest entries (+Inf first), on odd
    steps the k most negative (-Inf first), all sent as their mean (one value) with their
    indices, as (values, indices)."""
    flat, k, tidx = _checked(x, k, "qrgc", allow_nan)
    as32 = _nan_to_zero(tf.cast(flat, tf.float32))
    even = tf.equal(tf.math.floormod(_scalar(step, "step", "qrgc", integer=True), 2), 0)
    signed = tf.where(even, as32, -as32)
    _, idx = tf.math.top_k(signed, tf.cast(k, tf.int32), sorted=False)
    mean = tf.reduce_mean(tf.gather(as32, idx))
    return tf.cast(tf.fill([k], mean), flat.dtype), tf.cast(idx, tidx)


@selector("threshold_search")
def _threshold_search_selection(x, k, allow_nan=False):
    return threshold_search(x, k, allow_nan)[:2]

