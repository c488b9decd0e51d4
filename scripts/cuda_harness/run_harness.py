"""GPU check of the CUDA kernels (ops/**/*.cu.h) on a machine with CUDA, CuPy and nvcc but no
TensorFlow.

Builds build/libtfc_harness.so from harness.cu (the same headers the TF GPU kernels compile) and
runs it on CuPy arrays:
  1. checks (checks.py): every selector's GPU part against the numpy reference tests/reference.py,
     bit for bit (MSTopK; threshold_select at the thresholds of trimmed_topk, threshold_search and
     dgc_topk; the NaN count of the other selectors' check), at sizes 1 ... 100M with density
     0.001, plus the edge cases of tests/test_selectors.py; scatter_add against numpy.add.at;
  2. timings at 25M and 100M floats, density 0.001: MSTopK against torch.topk on |x| in the same
     run, and MSTopK's time against one read of x at the GPU's measured copy bandwidth
     (device-to-device copy, read + write bytes / time): "x reads" = MSTopK time / (4 d / copy
     bandwidth), the limit being 1; "fraction of bw" = 4 d / MSTopK time / copy bandwidth.
Prints a table, one JSON line per size (--json: only those), and exits 2 on any mismatch.

    python3 scripts/cuda_harness/run_harness.py                 # checks, then 25M and 100M timings
    python3 scripts/cuda_harness/run_harness.py --sizes 25M --sweep-upto 10M --no-edge
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import checks  # noqa: E402  (CuPy-free; tests/test_cuda_harness.py runs it on the CPU kernels)


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

REPORT = checks.Report(out=lambda line: print(line, flush=True))
expect = REPORT.expect


class GpuBackend:
    """checks.py's backend over the CUDA kernels: numpy in, device, numpy out."""

    def __init__(self, lib):
        self.lib = lib

    def mstopk(self, x, k, ns, seed, allow_nan, tidx):
        idx, val, thr, cnt = self.lib.mstopk(cp.asarray(x), k, ns, seed, allow_nan, tidx)
        return cp.asnumpy(idx), cp.asnumpy(val), thr, cnt[:4], cnt[4], bool(cnt[5])

    def threshold_select(self, x, t):
        idx, val, n_nan = self.lib.threshold_select(cp.asarray(x), t)
        return cp.asnumpy(idx), cp.asnumpy(val), int(n_nan)

    def count_nan(self, x):
        return self.lib.count_nan(cp.asarray(x))


def run_checks(lib, sweep_sizes, edge):
    be = GpuBackend(lib)
    checks.run_sweep(be, REPORT, sweep_sizes)
    if edge:
        checks.run_edge_cases(be, REPORT)
        check_mstopk_16m(be)
        check_scatter_add(lib)
    cp.get_default_memory_pool().free_all_blocks()


def check_mstopk_16m(be):
    checks.check_mstopk(be, REPORT, checks.gaussian(16_000_000, 8), 16_000, label="16M")


def check_scatter_add(lib):
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


def copy_bandwidth(nbytes, reps):
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written, per second)."""
    src, dst = cp.empty(nbytes, cp.uint8), cp.empty(nbytes, cp.uint8)
    t = timed(lambda: cp.copyto(dst, src), reps,
              cp.cuda.Device().synchronize)
    del src, dst
    return 2 * nbytes / t / 1e6


def run_bench(lib, sizes, reps, as_json):
    try:
        import torch
        assert torch.cuda.is_available()
    except Exception:
        torch = None
        print("torch with CUDA not available: torch.topk column skipped")
    sync = cp.cuda.Device().synchronize
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    bw = copy_bandwidth(max(sizes) * 4, reps)
    if not as_json:
        print(f"\n{dev}; float32 x ~ N(0,1), k = {checks.DENSITY} d; median ms of {reps} after 2 "
              f"warm-ups; copy bandwidth {bw:.0f} GB/s (read + write)")
        print(f"{'d':>11} {'k':>8} {'mstopk ms':>10} {'torch.topk':>11} {'speedup':>8} "
              f"{'1 read ms':>10} {'x reads':>8} {'frac bw':>8}")
    rows = []
    for d in sizes:
        k = max(1, int(d * checks.DENSITY))
        x = cp.random.RandomState(d).standard_normal(d, dtype=cp.float32)
        ws = cp.empty(lib.L.tfc_mstopk_workspace_bytes(d), cp.uint8)
        out = (cp.empty(k, cp.int64), cp.empty(k, cp.float32))
        idx = cp.asnumpy(lib.mstopk(x, k, ws=ws, out=out)[0])  # the timed input is checked too
        expect(idx.tolist() == checks.ref.mstopk(cp.asnumpy(x), k)[0].tolist(),
               f"bench input d={d}: = reference")
        t_ms = timed(lambda: lib.mstopk(x, k, ws=ws, out=out), reps, sync)
        t_torch = None
        if torch is not None:
            xt = torch.from_dlpack(x)
            t_torch = timed(lambda: torch.topk(xt.abs(), k, sorted=False), reps,
                            torch.cuda.synchronize)
            del xt
        row = {"bench": "mstopk_gpu", "device": dev, **checks.bench_row(d, t_ms, t_torch, bw)}
        rows.append(row)
        if not as_json:
            tt = "-" if t_torch is None else f"{t_torch:.3f}"
            sp = "-" if t_torch is None else f"{row['speedup_vs_torch']:.1f}"
            print(f"{d:>11} {k:>8} {t_ms:10.3f} {tt:>11} {sp:>8} {row['one_read_ms']:10.3f} "
                  f"{row['x_reads']:8.2f} {row['fraction_of_bw']:8.3f}")
        print(json.dumps(row), flush=True)
        del x, ws, out
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="25M,100M", help="timed sizes (density 0.001)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--sweep-upto", default="100M",
                   help=f"largest checked size of the sweep {checks.SWEEP_SIZES}")
    p.add_argument("--no-edge", action="store_true", help="skip the edge cases and scatter_add")
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--no-bench", action="store_true")
    p.add_argument("--json", action="store_true", help="print only the JSON lines of the timings")
    p.add_argument("--nvcc", default=os.environ.get("NVCC") or shutil.which("nvcc") or "nvcc")
    args = p.parse_args()
    if args.json:
        REPORT.out = lambda line: print(line, file=sys.stderr, flush=True)
    lib = Lib(build(args.nvcc))
    if not args.no_check:
        upto = checks.parse_size(args.sweep_upto)
        run_checks(lib, [d for d in checks.SWEEP_SIZES if d <= upto], not args.no_edge)
    if not args.no_bench:
        run_bench(lib, [checks.parse_size(s) for s in args.sizes.split(",")], args.reps, args.json)
    if REPORT.failures:
        die(f"{len(REPORT.failures)} check(s) failed:\n  " + "\n  ".join(REPORT.failures))
    print(f"run_harness: all {REPORT.passed} checks passed", file=sys.stderr if args.json else sys.stdout)


if __name__ == "__main__":
    main()
