"""Plain numpy versions of the papers' algorithms, written for reading, not for speed."""
import numpy as np

LANES, CHUNK = 16, 16384
MASK64 = (1 << 64) - 1


def abs_of(x):
    """a = |x| as float32 with NaN read as 0."""
    a = np.abs(np.asarray(x, dtype=np.float32).ravel())
    return np.where(np.isnan(a), np.float32(0), a)


def fixed_order_mean(a):
    """Mean of the finite a in the summation order defined in ops/topk/mstopk.h."""
    finite = np.isfinite(a)
    v = np.where(finite, a, 0).astype(np.float64)
    v = np.concatenate([v, np.zeros((-len(v)) % CHUNK)]).reshape(-1, CHUNK // LANES, LANES)
    lanes = np.cumsum(v, axis=1)[:, -1, :]     # sequential over t, per lane
    chunks = np.cumsum(lanes, axis=1)[:, -1]   # sequential over the lanes
    total = np.cumsum(chunks)[-1]              # sequential over the chunks
    return float(total) / int(finite.sum())


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def mstopk(x, k, num_samplings=30, seed=0):
    """shi2021 Algorithm 1, with the edge cases defined as in ops/topk/mstopk.h.

    Returns (indices, thres1, thres2, k1, k2, start)."""
    a = abs_of(x)
    d = len(a)
    inf = np.isinf(a)
    n_inf = int(inf.sum())
    if k >= d:
        return np.arange(d), 0.0, 0.0, d, d, 0
    if n_inf >= k:
        return np.flatnonzero(inf)[:k], np.inf, np.inf, k, n_inf, 0
    mean = fixed_order_mean(a)
    u = float(a[~inf].max())
    a64 = a.astype(np.float64)
    l, r = 0.0, 1.0
    k1, k2 = 0, d
    thres1 = thres2 = None
    for _ in range(num_samplings):
        ratio = l + (r - l) / 2
        thres = mean + ratio * (u - mean)
        nnz = int(np.count_nonzero(a64 >= thres))
        if nnz <= k:
            r = ratio
            if nnz > k1:
                k1, thres1 = nnz, thres
        else:
            l = ratio
            if nnz < k2:
                k2, thres2 = nnz, thres
    if thres1 is None:
        thres1, k1 = np.inf, n_inf
    if thres2 is None:
        thres2, k2 = 0.0, d
    iota1 = np.flatnonzero(a64 >= thres1)
    iota2 = np.flatnonzero((a64 < thres1) & (a64 >= thres2))
    start = splitmix64(seed) % (len(iota2) - (k - k1) + 1)
    return np.concatenate([iota1, iota2[start:start + k - k1]]), thres1, thres2, k1, k2, start


def exact_topk_indices(x, k):
    a = abs_of(x)
    return np.argsort(-a.astype(np.float64), kind="stable")[:k]


def trimmed_topk_threshold(x, k):
    """RedSync Alg. 2 as corrected: the first ratio 0.8, 0.6, ..., 0 that lets k entries pass."""
    a = abs_of(x).astype(np.float64)
    mean, u = fixed_order_mean(abs_of(x)), float(a[np.isfinite(a)].max())
    for ratio in (0.8, 0.6, 0.4, 0.2, 0.0):
        t = mean + ratio * (u - mean)
        if np.count_nonzero(a >= t) >= k:
            return t
    return 0.0


def threshold_search(x, k, max_iter=52):
    """RedSync Alg. 3 as corrected: binary search on the ratio until k <= nnz < 2k."""
    a = abs_of(x).astype(np.float64)
    d = len(a)
    if k >= d:
        return 0.0
    mean, u = fixed_order_mean(abs_of(x)), float(a[np.isfinite(a)].max())
    l, r, best = 0.0, 1.0, None
    for _ in range(max_iter):
        ratio = l + (r - l) / 2
        nnz = np.count_nonzero(a >= mean + ratio * (u - mean))
        if nnz < k:
            r = ratio
        elif nnz >= 2 * k:
            l = best = ratio
        else:
            best = ratio
            break
    if best is not None:
        return mean + best * (u - mean)
    return mean if np.count_nonzero(a >= mean) >= k else 0.0


def sparcml_sum(streams, d, algorithm):
    """SparCML's sum (tf_commlib/collectives/sparcml.py) of streams[r] = (indices, float32 values)
    of rank r, adding in the same order: a merge adds its streams in rank order starting from 0;
    the ranks r >= P' (P' the largest power of two <= P) are first merged into r - P'; then
    "rd": in round t, rank r merges with r XOR 2^t (the lower one first); "split": the owner of
    each slice of ceil(d/P') indices merges the P' streams' entries in it. Returns the dense result."""
    p = len(streams)
    q = 1 << (p.bit_length() - 1)

    def merge(parts):
        size = len(parts[0][0])
        present, out = np.zeros(size, bool), np.zeros(size, np.float32)
        for mask, values in parts:
            out[mask] = out[mask] + values[mask]
            present |= mask
        return present, out

    def stream(indices, values):
        mask, dense = np.zeros(d, bool), np.zeros(d, np.float32)
        mask[indices], dense[indices] = True, values
        return merge([(mask, dense)])

    s = [stream(i, v) for i, v in streams]
    s = [merge([s[r], s[r + q]]) if r + q < p else s[r] for r in range(q)]
    if algorithm == "rd":
        for t in range(q.bit_length() - 1):
            s = [merge([s[min(r, r ^ (1 << t))], s[max(r, r ^ (1 << t))]]) for r in range(q)]
        mask, values = s[0]
    else:
        n_slice = -(-d // q)
        mask, values = np.zeros(d, bool), np.zeros(d, np.float32)
        for j in range(q):
            part = slice(j * n_slice, (j + 1) * n_slice)
            mask[part], values[part] = merge([(m[part], v[part]) for m, v in s])
    result = np.zeros(d, np.float32)
    result[mask] = result[mask] + values[mask]
    return result
