"""The correctness checks of run_harness.py, written against a backend so that they need neither
CuPy nor a GPU: run_harness.py passes the CUDA kernels (harness.cu through CuPy), the CPU test
tests/test_cuda_harness.py passes the TensorFlow CPU kernels, which are bit-identical to the
numpy reference tests/reference.py; the expected results always come from that reference.

A backend takes and returns numpy arrays:
    mstopk(x, k, ns, seed, allow_nan, tidx) -> (indices, values, thresholds[4], counts[4],
                                                n_nan, nan_rejected)
    threshold_select(x, t) -> (indices, values, n_nan)     NaN read as 0, counted
    count_nan(x) -> int
Every selector of tf_commlib.ops is covered through the GPU code it runs: mstopk (its kernel),
threshold_select at the thresholds of trimmed_topk, threshold_search and dgc_topk (their GPU
selection step), and the NaN count of the check every other selector (exact_topk, randomk, qrgc)
runs before TensorFlow's own GPU ops.
"""
import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("reference", ROOT / "tests" / "reference.py")
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

DENSITY = 0.001
SWEEP_SIZES = [1, 10, 1000, 100_000, 1_000_003, 10_000_000, 25_000_000, 100_000_000]


def parse_size(s):
    """'25M' = 25,000,000 (decimal, as in the issue's targets), '1k' = 1000, or a plain integer."""
    mult = {"k": 10**3, "m": 10**6, "g": 10**9}.get(s[-1].lower())
    return int(float(s[:-1]) * mult) if mult else int(s)


def bench_row(d, t_ms, t_torch, bw_gbps):
    """The table's numbers for one size: MSTopK against one read of x at the copy bandwidth."""
    one_read_ms = 4 * d / bw_gbps / 1e6
    return {"d": d, "k": max(1, int(d * DENSITY)), "mstopk_ms": round(t_ms, 4),
            "torch_topk_abs_ms": None if t_torch is None else round(t_torch, 4),
            "speedup_vs_torch": None if t_torch is None else round(t_torch / t_ms, 2),
            "copy_bw_gbps": round(bw_gbps, 1), "one_read_ms": round(one_read_ms, 4),
            "x_reads": round(t_ms / one_read_ms, 2),
            "fraction_of_bw": round(one_read_ms / t_ms, 3)}


class Report:
    """Prints one ok/FAIL line per check and keeps the failures."""

    def __init__(self, out=print):
        self.failures, self.passed, self.out = [], 0, out

    def expect(self, cond, what):
        self.out(("ok    " if cond else "FAIL  ") + what)
        if cond:
            self.passed += 1
        else:
            self.failures.append(what)
        return cond


def nan0(v):
    return np.where(np.isnan(v), 0, v).astype(v.dtype)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8),
                                                                        b.view(np.uint8))


def gaussian(d, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(d).astype(dtype)


def check_mstopk(be, rep, x, k, ns=30, seed=7, allow_nan=False, tidx=np.int64, label=""):
    flat = np.asarray(x).ravel()
    idx, val, thr, cnt, _, rejected = be.mstopk(flat, k, ns, seed, allow_nan, tidx)
    e_idx, t1, t2, k1, k2, start = ref.mstopk(flat, k, ns, seed)
    a = ref.abs_of(flat)
    fin = np.isfinite(a)
    mean_ok = fin.sum() == 0 or thr[2] == ref.fixed_order_mean(a)
    u_ok = fin.sum() == 0 or thr[3] == float(a[fin].max())
    ok = (not rejected and np.asarray(idx).astype(np.int64).tolist() == e_idx.tolist()
          and np.asarray(idx).dtype == np.dtype(tidx)
          and [float(v) for v in thr[:2]] == [float(t1), float(t2)]
          and list(cnt[:3]) == [k1, k2, start] and cnt[3] == int(np.isinf(a).sum())
          and mean_ok and u_ok and same_bits(val, nan0(flat[e_idx])))
    detail = "" if ok else f" got thr={list(thr)} cnt={list(cnt)} expected {(t1, t2, k1, k2, start)}"
    rep.expect(ok, f"mstopk {label or flat.dtype} d={flat.size} k={k} ns={ns} seed={seed}{detail}")
    return e_idx, t1, t2, k1, k2, start


def check_threshold_select(be, rep, x, t, label):
    flat = np.asarray(x).ravel()
    idx, val, n_nan = be.threshold_select(flat, t)
    e = np.flatnonzero(ref.abs_of(flat).astype(np.float64) >= t)
    ok = (np.asarray(idx).astype(np.int64).tolist() == e.tolist()
          and n_nan == int(np.isnan(flat).sum()) and same_bits(val, nan0(flat[e])))
    return rep.expect(ok, f"threshold_select {label} {flat.dtype} d={flat.size} t={t!r} "
                          f"({e.size} expected, {len(idx)} got)")


def dgc_threshold(x, k, sample_ratio=0.01, seed=0):
    """A threshold as tf_commlib.ops.dgc_topk computes it (its formula; numpy draws the sample):
    of a random sample of |x|, the smallest of its top ks, ks aimed 25 % and 3 standard
    deviations above k n / d."""
    a = ref.abs_of(x)
    d = a.size
    n = min(d, max(int(d * sample_ratio), 1000))
    sample = a[np.random.default_rng(seed).integers(0, d, n)]
    expect = k * n / d
    ks = min(int(np.ceil(1.25 * expect + 3.0 * np.sqrt(expect))) + 1, n)
    return float(np.sort(sample)[-ks]) if ks > 0 else float("inf")


def check_selectors_at(be, rep, x, k, label):
    """Every selector's GPU part on x with k = density * size: mstopk, and threshold_select at the
    thresholds of trimmed_topk, threshold_search, dgc_topk and mstopk's thres1."""
    thres1 = check_mstopk(be, rep, x, k, label=label)[1]
    thresholds = {"trimmed_topk": ref.trimmed_topk_threshold(x, k),
                  "threshold_search": ref.threshold_search(x, k),
                  "dgc_topk": dgc_threshold(x, k),
                  "mstopk thres1": thres1}
    for name, t in thresholds.items():
        check_threshold_select(be, rep, x, float(t), f"[{name}, {label}]")
    x2 = x.copy()
    x2[:: max(1, x.size // 3)] = np.nan
    rep.expect(be.count_nan(x2) == int(np.isnan(x2).sum()),
               f"NaN count (exact_topk/randomk/qrgc check) {label} d={x.size}")


def run_sweep(be, rep, sizes=SWEEP_SIZES, density=DENSITY):
    """Sizes 1 ... 100M, k = max(1, density * size)."""
    for d in sizes:
        check_selectors_at(be, rep, gaussian(d, d), max(1, int(d * density)), f"sweep d={d}")


def run_edge_cases(be, rep):
    """The cases of tests/test_selectors.py, and random ones."""
    for d, k in [(1, 1), (100, 7), (20_000, 20), (1_000_003, 1000), (300_000, 150_000)]:
        for ns in (1, 5, 12, 13, 30, 52):
            check_mstopk(be, rep, gaussian(d, d + k), k, ns)
    check_mstopk(be, rep, gaussian(50_000, 3, np.float16), 50)
    check_mstopk(be, rep, gaussian(70_000, 4), 70, tidx=np.int32, label="int32 indices")
    rng = np.random.default_rng(5)
    check_mstopk(be, rep, rng.exponential(size=(300, 700)).astype(np.float32), 210,
                 label="exponential")
    check_mstopk(be, rep, rng.standard_cauchy(400_000).astype(np.float32), 400, label="cauchy")
    check_mstopk(be, rep, rng.integers(-3, 4, 200_000).astype(np.float32), 1000, label="ties")
    ties = np.random.default_rng(2).integers(0, 3, 100_000).astype(np.float32)
    for s in range(5):
        check_mstopk(be, rep, ties, 500, seed=s, label="band of ties")
    x = gaussian(10_000, 1)
    check_mstopk(be, rep, x, 20_000, label="k >= size")
    check_mstopk(be, rep, x, 10_000, label="k == size")
    check_mstopk(be, rep, np.full(10_000, -2.5, np.float32), 10, label="all equal")
    check_mstopk(be, rep, np.zeros(10_000, np.float32), 10, label="zeros")
    y = x.copy()
    y[[5, 77, 9000]] = [np.inf, -np.inf, np.inf]
    check_mstopk(be, rep, y, 10, label="+-inf")
    y = x.copy()
    y[::100] = -np.inf
    check_mstopk(be, rep, y, 10, label="n_inf >= k")
    check_mstopk(be, rep, np.full(5000, np.inf, np.float32), 7, label="all inf")
    check_mstopk(be, rep, np.array(3.0, np.float32), 1, label="one")
    y = gaussian(2_000_000, 4)
    y[17] = 1e6
    check_mstopk(be, rep, y, 2000, label="outlier (full passes)")
    y = gaussian(1000)
    y[[3, 4]] = np.nan
    check_mstopk(be, rep, y, 10, allow_nan=True, label="NaN allowed")
    *_, n_nan, rejected = be.mstopk(y, 10, 30, 7, False, np.int64)
    rep.expect(n_nan == 2 and rejected, f"mstopk rejects NaN without allow_nan ({n_nan}, {rejected})")
    for t in range(24):
        r = np.random.default_rng(100 + t)
        d = int(r.integers(1, 400_000))
        x = [r.standard_normal(d), r.laplace(size=d) * 1e-3, r.integers(-2, 3, d),
             r.lognormal(0, 3, d)][t % 4].astype(np.float32)
        if t % 5 == 0:
            x[r.integers(0, d, 3)] = np.inf
        check_mstopk(be, rep, x, int(r.integers(1, d + 2)), int(r.integers(1, 53)), seed=t,
                     label=f"random #{t}")

    x = gaussian(1_000_003, 9)
    x[[10, 20]] = [np.nan, np.inf]
    a = ref.abs_of(x).astype(np.float64)
    for dtype in (np.float32, np.float16):
        for t in (-np.inf, -1.0, 0.0, 1.5, 3.0, float(a[11]), np.inf):
            check_threshold_select(be, rep, x.astype(dtype), t, "edge")
