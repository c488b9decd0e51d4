"""Python API of the custom ops: sparse decompression (scatter_add) and the top-k selectors."""
import tensorflow as tf

from tf_commlib._loader import ops as _ops

FLOAT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def _invalid(msg):
    return tf.errors.InvalidArgumentError(None, None, msg)


def check_float(x, name):
    """Converts x to a tensor and checks it holds float32/float16/bfloat16."""
    x = tf.convert_to_tensor(x)
    if x.dtype not in FLOAT_DTYPES:
        raise _invalid(f"{name} must be float32, float16 or bfloat16, got {x.dtype.name}")
    return x


def scatter_add(indices, values, size):
    """Dense vector of length ``size`` with ``values`` added at ``indices`` (repeats are summed).

    This is the decompression step of every sparse collective. ``indices`` is int32 or int64,
    ``values`` float32/float16/bfloat16 of the same length; out-of-range indices raise.
    """
    values = check_float(values, "values")
    indices = tf.convert_to_tensor(indices)
    if indices.dtype not in (tf.int32, tf.int64):
        raise _invalid(f"indices must be int32 or int64, got {indices.dtype.name}")
    return _ops.commlib_scatter_add(indices, values, tf.cast(size, tf.int64))


def _prepare(x, k, name):
    """Flattens x, checks its dtype and k, and picks the index dtype."""
    x = check_float(x, "x")
    if isinstance(k, int) and k <= 0:
        raise _invalid(f"{name}: k must be positive, got {k}")
    size = x.shape.num_elements()
    tidx = tf.int64 if size is not None and size >= 2**31 else tf.int32
    if x.shape.rank == 0 and isinstance(k, int) and k > 1:
        raise _invalid(f"{name}: x is a scalar (rank 0) but k = {k}")
    return x, tf.cast(k, tf.int64), tidx


def _seed(seed):
    return tf.constant(-1, tf.int64) if seed is None else tf.cast(seed, tf.int64)


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
    return _ops.commlib_mstopk(x, k, _seed(seed), Tidx=tidx, num_samplings=num_samplings,
                               allow_nan=allow_nan)


def threshold_search(x, k, allow_nan=False):
    """RedSync Alg. 3 (corrected): (values, indices, threshold) with k <= count < 2k where ties allow."""
    x, k, tidx = _prepare(x, k, "threshold_search")
    return _ops.commlib_threshold_search(x, k, Tidx=tidx, allow_nan=allow_nan)


def threshold_select(x, threshold, allow_nan=False):
    """Every entry with |x| >= threshold, as (values, indices) in index order."""
    x = check_float(x, "x")
    tidx = tf.int64 if (x.shape.num_elements() or 0) >= 2**31 else tf.int32
    return _ops.commlib_threshold_select(x, tf.cast(threshold, tf.float64), Tidx=tidx,
                                         allow_nan=allow_nan)


def exact_topk(x, k):
    """The exact k largest |x| (reference selector), as (values, indices)."""
    x, k, tidx = _prepare(x, k, "exact_topk")
    flat = tf.reshape(x, [-1])
    if flat.dtype != tf.float32:  # top_k on half types is slow or missing on some builds
        mags = tf.abs(tf.cast(flat, tf.float32))
    else:
        mags = tf.abs(flat)
    k = tf.minimum(k, tf.size(flat, out_type=tf.int64))
    _, idx = tf.math.top_k(mags, tf.cast(k, tf.int32), sorted=False)
    return tf.gather(flat, idx), tf.cast(idx, tidx)


def trimmed_topk(x, k, allow_nan=False):
    """RedSync Alg. 2 (corrected): threshold mean + ratio*(max - mean) for ratio 0.8, 0.6, ... 0
    (the first that at least k entries pass), then the exact top-k of those; exactly k out."""
    x, k, tidx = _prepare(x, k, "trimmed_topk")
    ratios = tf.constant([0.8, 0.6, 0.4, 0.2, 0.0], tf.float64)
    stats, counts = _ops.commlib_ratio_counts(x, ratios, allow_nan=allow_nan)
    ok = counts >= k
    first = tf.argmax(tf.cast(ok, tf.int32))  # first ratio with enough entries
    ratio = tf.where(tf.reduce_any(ok), tf.gather(ratios, first), tf.constant(-1.0, tf.float64))
    threshold = tf.where(ratio >= 0, stats[0] + ratio * (stats[1] - stats[0]), 0.0)
    values, indices = _ops.commlib_threshold_select(x, threshold, Tidx=tidx, allow_nan=allow_nan)
    return _exact_among(values, indices, k)


def _exact_among(values, indices, k):
    """The k largest |values| among already selected candidates."""
    k = tf.minimum(k, tf.size(values, out_type=tf.int64))
    _, pos = tf.math.top_k(tf.abs(tf.cast(values, tf.float32)), tf.cast(k, tf.int32), sorted=False)
    return tf.gather(values, pos), tf.gather(indices, pos)


def dgc_topk(x, k, sample_ratio=0.01, seed=None, allow_nan=False):
    """DGC §5 selection: the top-k threshold of a random sample of |x|, the entries above it,
    and the exact top-k of those when more than k pass; exactly k out."""
    x, k, tidx = _prepare(x, k, "dgc_topk")
    if not 0.0 < sample_ratio <= 1.0:
        raise _invalid(f"dgc_topk: sample_ratio must be in (0, 1], got {sample_ratio}")
    flat = tf.reshape(x, [-1])
    d = tf.size(flat, out_type=tf.int64)
    k = tf.minimum(k, d)
    n = tf.minimum(d, tf.maximum(tf.cast(tf.cast(d, tf.float64) * sample_ratio, tf.int64), 1000))
    seeds = tf.stack([_seed(seed), tf.constant(0x5EED, tf.int64)])
    if seed is None:
        seeds = tf.random.uniform([2], 0, 2**31, tf.int64)
    pick = tf.random.stateless_uniform([n], seeds, 0, d, tf.int64)
    sample = tf.abs(tf.cast(tf.gather(flat, pick), tf.float32))
    # The sample's top-(k n / d) threshold lets fewer than k through half the time; aim 25 % and
    # 3 standard deviations lower so the exact fallback is rare.
    expect = tf.cast(k * n, tf.float64) / tf.cast(d, tf.float64)
    ks = tf.cast(tf.math.ceil(1.25 * expect + 3.0 * tf.sqrt(expect)), tf.int32) + 1
    ks = tf.minimum(ks, tf.cast(n, tf.int32))
    threshold = tf.cast(tf.reduce_min(tf.math.top_k(sample, ks, sorted=False).values), tf.float64)
    values, indices = _ops.commlib_threshold_select(x, threshold, Tidx=tidx, allow_nan=allow_nan)
    enough = tf.size(values, out_type=tf.int64) >= k
    return tf.cond(enough, lambda: _exact_among(values, indices, k), lambda: exact_topk(x, k))


def randomk(x, k, seed=None):
    """k distinct uniformly random entries of flat x (baseline), as (values, indices) sorted by index."""
    x, k, tidx = _prepare(x, k, "randomk")
    flat = tf.reshape(x, [-1])
    d = tf.size(flat, out_type=tf.int64)
    k = tf.minimum(k, d)
    key = tf.stack([_seed(seed), tf.constant(0x4A4D, tf.int64)])
    if seed is None:
        key = tf.random.uniform([2], 0, 2**31, tf.int64)
    idx = tf.sort(tf.random.experimental.index_shuffle(tf.range(k), tf.cast(key, tf.int64), d - 1))
    return tf.gather(flat, idx), tf.cast(idx, tidx)


def qrgc(x, k, step=0):
    """RedSync's quantized selection: on even steps the k largest entries, on odd steps the k most
    negative, all sent as their mean (one value) with their indices, as (values, indices)."""
    x, k, tidx = _prepare(x, k, "qrgc")
    flat = tf.reshape(x, [-1])
    k = tf.cast(tf.minimum(k, tf.size(flat, out_type=tf.int64)), tf.int32)
    as32 = tf.cast(flat, tf.float32)
    signed = tf.where(tf.equal(tf.math.floormod(tf.cast(step, tf.int64), 2), 0), as32, -as32)
    _, idx = tf.math.top_k(signed, k, sorted=False)
    mean = tf.reduce_mean(tf.gather(as32, idx))
    return tf.cast(tf.fill([k], mean), x.dtype), tf.cast(idx, tidx)


SELECTORS = {
    "mstopk": mstopk,
    "exact_topk": exact_topk,
    "dgc_topk": dgc_topk,
    "trimmed_topk": trimmed_topk,
    "threshold_search": lambda x, k: threshold_search(x, k)[:2],
    "randomk": randomk,
    "qrgc": qrgc,
}
STEPPED = ("qrgc",)                               # selectors that take the step
SEEDED = ("mstopk", "dgc_topk", "randomk")        # selectors that take a seed
