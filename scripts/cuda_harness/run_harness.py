#!/usr/bin/env python3
"""GPU check of the CUDA kernels (ops/**/*.cu.h) on a machine with CUDA, CuPy and nvcc but no
TensorFlow.

Builds build/libtfc_harness.so from harness.cu (the same headers the TF GPU kernels compile),
runs it on CuPy arrays, requires bit-identical results to the numpy reference tests/reference.py
(mstopk, threshold_select; scatter_add against numpy.add.at), then times mstopk against torch.topk
on |x| and against one read pass over x, density k/d = 0.001, and prints a table and one JSON line
per size.

    python3 scripts/cuda_harness/run_harness.py                 # checks, then 1M..128M timings
    python3 scripts/cuda_harness/run_harness.py --sizes 1M,16M   # or --no-bench / --no-check
"""
import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
spec = importlib.util.spec_from_file_location("reference", ROOT / "tests" / "reference.py")
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)


def die(msg):
    print(f"run_harness: FAILED: {msg}", file=sys.stderr)
    sys.exit(2)


try:
    import cupy as cp
    if cp.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no CUDA device")
except Exception as e:  # ImportError, CUDARuntimeError, ...
    die(f"CUDA is not available ({type(e).__name__}: {e})")

from tfc_harness import Lib, build  # noqa: E402 (needs CuPy)


FAILURES = []


def expect(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def nan0(v):
    return np.where(np.isnan(v), 0, v).astype(v.dtype)


def check_mstopk(lib, x, k, ns=30, seed=7, allow_nan=False, tidx=np.int64, label=""):
    x = np.asarray(x)
    flat = x.ravel()
    idx, val, thr, cnt = lib.mstopk(cp.asarray(flat), k, ns, seed, allow_nan, tidx)
    e_idx, t1, t2, k1, k2, start = ref.mstopk(flat, k, ns, seed)
    a = ref.abs_of(flat)
    fin = np.isfinite(a)
    mean_ok = fin.sum() == 0 or thr[2] == ref.fixed_order_mean(a)
    u_ok = fin.sum() == 0 or thr[3] == float(a[fin].max())
    got = cp.asnumpy(idx).astype(np.int64)
    ok = (got.tolist() == e_idx.tolist() and thr[:2] == [float(t1), float(t2)]
          and cnt[:3] == [k1, k2, start] and cnt[3] == int(np.isinf(a).sum()) and mean_ok and u_ok
          and np.array_equal(cp.asnumpy(val).view(np.uint8), nan0(flat[e_idx]).view(np.uint8)))
    detail = "" if ok else f" got thr={thr} cnt={cnt} expected {(t1, t2, k1, k2, start)}"
    expect(ok, f"mstopk {label or x.dtype} d={flat.size} k={k} ns={ns} seed={seed}{detail}")


def gaussian(d, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(d).astype(dtype)


def run_checks(lib):
    for d, k in [(1, 1), (100, 7), (20_000, 20), (1_000_003, 1000), (300_000, 150_000)]:
        for ns in (1, 5, 12, 13, 30, 52):
            check_mstopk(lib, gaussian(d, d + k), k, ns)
    check_mstopk(lib, gaussian(50_000, 3, np.float16), 50)
    check_mstopk(lib, gaussian(70_000, 4), 70, tidx=np.int32, label="int32 indices")
    rng = np.random.default_rng(5)
    check_mstopk(lib, rng.exponential(size=(300, 700)).astype(np.float32), 210, label="exponential")
    check_mstopk(lib, rng.standard_cauchy(400_000).astype(np.float32), 400, label="cauchy")
    check_mstopk(lib, rng.integers(-3, 4, 200_000).astype(np.float32), 1000, label="ties")
    ties = np.random.default_rng(2).integers(0, 3, 100_000).astype(np.float32)
    for s in range(5):
        check_mstopk(lib, ties, 500, seed=s, label="band of ties")
    x = gaussian(10_000, 1)
    check_mstopk(lib, x, 20_000, label="k >= size")
    check_mstopk(lib, x, 10_000, label="k == size")
    check_mstopk(lib, np.full(10_000, -2.5, np.float32), 10, label="all equal")
    check_mstopk(lib, np.zeros(10_000, np.float32), 10, label="zeros")
    y = x.copy()
    y[[5, 77, 9000]] = [np.inf, -np.inf, np.inf]
    check_mstopk(lib, y, 10, label="+-inf")
    y = x.copy()
    y[::100] = -np.inf
    check_mstopk(lib, y, 10, label="n_inf >= k")
    check_mstopk(lib, np.full(5000, np.inf, np.float32), 7, label="all inf")
    check_mstopk(lib, np.array(3.0, np.float32), 1, label="one")
    y = gaussian(2_000_000, 4)
    y[17] = 1e6
    check_mstopk(lib, y, 2000, label="outlier (full passes)")
    check_mstopk(lib, gaussian(16_000_000, 8), 16_000, label="16M")
    y = gaussian(1000)
    y[[3, 4]] = np.nan
    check_mstopk(lib, y, 10, allow_nan=True, label="NaN allowed")
    _, _, _, cnt = lib.mstopk(cp.asarray(y), 10)
    expect(cnt[4] == 2 and cnt[5] == 1, f"mstopk rejects NaN without allow_nan (counts {cnt})")
    for t in range(24):
        r = np.random.default_rng(100 + t)
        d = int(r.integers(1, 400_000))
        x = [r.standard_normal(d), r.laplace(size=d) * 1e-3, r.integers(-2, 3, d),
             r.lognormal(0, 3, d)][t % 4].astype(np.float32)
        if t % 5 == 0:
            x[r.integers(0, d, 3)] = np.inf
        check_mstopk(lib, x, int(r.integers(1, d + 2)), int(r.integers(1, 53)), seed=t,
                     label=f"random #{t}")

    x = gaussian(1_000_003, 9)
    x[[10, 20]] = [np.nan, np.inf]
    a = ref.abs_of(x).astype(np.float64)
    for dtype in (np.float32, np.float16):
        xs = x.astype(dtype)
        for t in (-np.inf, -1.0, 0.0, 1.5, 3.0, float(a[11]), np.inf):
            idx, val, n_nan = lib.threshold_select(cp.asarray(xs), t)
            e = np.flatnonzero(ref.abs_of(xs).astype(np.float64) >= t)
            ok = (cp.asnumpy(idx).tolist() == e.tolist() and n_nan == 1 and np.array_equal(
                cp.asnumpy(val).view(np.uint8), nan0(xs[e]).view(np.uint8)))
            expect(ok, f"threshold_select {np.dtype(dtype).name} t={t} ({e.size} selected)")

    rng = np.random.default_rng(3)
    for vdt, tol in ((np.float32, 1e-3), (np.float16, 0.5)):  # atol of the repeated sums
        for idt in (np.int32, np.int64):
            size = 1_000_000
            uniq = rng.permutation(size)[:50_000].astype(idt)
            vals = rng.standard_normal(uniq.size).astype(vdt)
            dense, err = lib.scatter_add(cp.asarray(uniq), cp.asarray(vals), size)
            want = np.zeros(size, vdt)
            np.add.at(want, uniq, vals)
            expect(err == 0 and np.array_equal(cp.asnumpy(dense), want),
                   f"scatter_add {np.dtype(vdt).name}/{np.dtype(idt).name} unique: exact")
            rep = rng.integers(0, 1000, 100_000).astype(idt)
            vals = rng.standard_normal(rep.size).astype(vdt)
            dense, err = lib.scatter_add(cp.asarray(rep), cp.asarray(vals), 1000)
            want = np.zeros(1000, np.float64)
            np.add.at(want, rep, vals.astype(np.float64))
            got = cp.asnumpy(dense).astype(np.float64)
            expect(err == 0 and np.allclose(got, want, rtol=0, atol=tol),
                   f"scatter_add {np.dtype(vdt).name}/{np.dtype(idt).name} repeats: close")
            bad = np.array([0, 5, -1, 7, 10], idt)
            dense, err = lib.scatter_add(cp.asarray(bad), cp.asarray(np.ones(5, vdt)), 10)
            expect(err == 1 and cp.asnumpy(dense).tolist() == [1, 0, 0, 0, 0, 1, 0, 1, 0, 0],
                   f"scatter_add {np.dtype(vdt).name}/{np.dtype(idt).name} out of range: flagged, "
                   "not written")
    dense, err = lib.scatter_add(cp.zeros(0, cp.int32), cp.zeros(0, cp.float32), 3)
    expect(err == 0 and cp.asnumpy(dense).tolist() == [0, 0, 0], "scatter_add n = 0")


def timed(fn, reps, sync):
    for _ in range(2):
        fn()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def run_bench(lib, sizes, reps, verify_upto):
    try:
        import torch
        assert torch.cuda.is_available()
    except Exception:
        torch = None
        print("torch with CUDA not available: torch.topk column skipped")
    sync = cp.cuda.Device().synchronize
    absmax = cp.ReductionKernel("float32 x", "float32 y", "fabsf(x)", "max(a, b)", "y = a", "0",
                                "absmax")  # one read of x
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    print(f"\n{dev}; float32 x ~ N(0,1), k = d/1000; median ms of {reps} (after 2 warm-ups)")
    print(f"{'d':>11} {'k':>8} {'mstopk':>9} {'torch.topk':>11} {'read pass':>10} {'GB/s':>7} "
          f"{'mstopk/read':>12} {'torch/mstopk':>13}")
    for d in sizes:
        k = max(1, d // 1000)
        x = cp.random.RandomState(d).standard_normal(d, dtype=cp.float32)
        ws = cp.empty(lib.L.tfc_mstopk_workspace_bytes(d), cp.uint8)
        out = (cp.empty(k, cp.int64), cp.empty(k, cp.float32))
        if d <= verify_upto:
            xh = cp.asnumpy(x)
            idx = cp.asnumpy(lib.mstopk(x, k, ws=ws, out=out)[0])
            expect(idx.tolist() == ref.mstopk(xh, k)[0].tolist(), f"bench input d={d}: = reference")
        t_ms = timed(lambda: lib.mstopk(x, k, ws=ws, out=out), reps, sync)
        t_read = timed(lambda: absmax(x), reps, sync)
        t_torch = None
        if torch is not None:
            xt = torch.from_dlpack(x)
            t_torch = timed(lambda: torch.topk(xt.abs(), k, sorted=False), reps, torch.cuda.synchronize)
            del xt
        gbps = d * 4 / t_read / 1e6
        tt = f"{t_torch:11.3f}" if t_torch else f"{'-':>11}"
        ratio = f"{t_torch / t_ms:13.2f}" if t_torch else f"{'-':>13}"
        print(f"{d:>11} {k:>8} {t_ms:9.3f} {tt} {t_read:10.3f} {gbps:7.0f} {t_ms / t_read:12.1f} {ratio}")
        print(json.dumps({"bench": "mstopk_gpu", "device": dev, "d": d, "k": k, "dtype": "float32",
                          "mstopk_ms": round(t_ms, 4), "torch_topk_abs_ms": t_torch and round(t_torch, 4),
                          "read_pass_ms": round(t_read, 4), "read_gbps": round(gbps, 1)}), flush=True)
        cp.get_default_memory_pool().free_all_blocks()


def parse_size(s):
    return int(float(s[:-1]) * (1 << 20)) if s[-1] in "Mm" else int(s)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="1M,2M,4M,8M,16M,32M,64M,128M")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--verify-upto", default="16M", help="bench sizes also checked vs reference")
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--no-bench", action="store_true")
    p.add_argument("--nvcc", default=os.environ.get("NVCC") or shutil.which("nvcc") or "nvcc")
    args = p.parse_args()
    lib = Lib(build(args.nvcc))
    if not args.no_check:
        run_checks(lib)
    if not args.no_bench:
        run_bench(lib, [parse_size(s) for s in args.sizes.split(",")], args.reps,
                  parse_size(args.verify_upto))
    if FAILURES:
        die(f"{len(FAILURES)} check(s) failed:\n  " + "\n  ".join(FAILURES))
    print("run_harness: all checks passed")


if __name__ == "__main__":
    main()
