"""The CuPy-free part of scripts/cuda_harness (checks.py), run on the CPU kernels: the GPU run
compares the CUDA kernels with tests/reference.py through this very code, so here it must pass on
the CPU kernels (bit-identical to the reference) and fail on a corrupted backend."""
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tf_commlib._loader import ops as raw

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "cuda_harness"))
import checks  # noqa: E402


def _nan_count_from(err):
    return int(re.search(r"x contains (\d+) NaN", str(err)).group(1))


class CpuBackend:
    """checks.py's backend over the TensorFlow CPU kernels (raw ops, as the GPU harness calls
    the CUDA code directly)."""

    def count_nan(self, x):
        try:
            raw.commlib_check_selection(x, np.int64(1), op_name="harness")
        except tf.errors.InvalidArgumentError as e:
            return _nan_count_from(e)
        return 0

    def mstopk(self, x, k, ns, seed, allow_nan, tidx):
        try:
            v, i, t, c = raw.commlib_mstopk(x, np.int64(k), np.int64(seed), Tidx=tf.as_dtype(tidx),
                                            num_samplings=ns, allow_nan=allow_nan)
        except tf.errors.InvalidArgumentError as e:
            empty = np.zeros(0, tidx)
            return empty, np.zeros(0, x.dtype), [0.0] * 4, [0] * 4, _nan_count_from(e), True
        return i.numpy(), v.numpy(), t.numpy().tolist(), c.numpy().tolist(), self.count_nan(x), False

    def threshold_select(self, x, t):
        v, i = raw.commlib_threshold_select(x, np.float64(t), Tidx=tf.int64, allow_nan=True)
        return i.numpy(), v.numpy(), self.count_nan(x)


class Corrupted(CpuBackend):
    """One wrong detail per call: what the harness must catch on a GPU."""

    def __init__(self, what):
        self.what = what

    def mstopk(self, x, k, ns, seed, allow_nan, tidx):
        i, v, t, c, n_nan, rej = super().mstopk(x, k, ns, seed, allow_nan, tidx)
        if self.what == "index" and len(i):
            i = i.copy()
            i[-1] = (i[-1] + 1) % x.size
        if self.what == "value" and len(v):
            v = v.copy()
            v[0] = np.nextafter(v[0], np.inf)
        if self.what == "threshold":
            t = [np.nextafter(t[0], np.inf)] + list(t[1:])
        if self.what == "count":
            c = [c[0], c[1], c[2] + 1, c[3]]
        return i, v, t, c, n_nan, rej

    def threshold_select(self, x, t):
        i, v, n = super().threshold_select(x, t)
        if self.what == "index" and len(i):
            i = i[:-1]
            v = v[:-1]
        if self.what == "value" and len(v):
            v = v.astype(np.float64).astype(v.dtype) * 2
        return i, v, n

    def count_nan(self, x):
        return super().count_nan(x) + (self.what == "count")


SMALL = [1, 10, 1000, 100_000]


def test_sweep_passes_on_the_cpu_kernels():
    rep = checks.Report(out=lambda line: None)
    checks.run_sweep(CpuBackend(), rep, SMALL)
    assert rep.failures == []
    assert rep.passed == len(SMALL) * 6  # mstopk, 4 thresholds, the NaN count per size


def test_edge_cases_pass_on_the_cpu_kernels():
    rep = checks.Report(out=lambda line: None)
    checks.run_edge_cases(CpuBackend(), rep)
    # every check ran and passed: 30 (size x num_samplings) + 10 (dtypes, distributions, ties)
    # + 10 (k >= size ... NaN allowed) + 1 (NaN rejected) + 24 random + 14 threshold_select
    assert rep.failures == [] and rep.passed == 89


@pytest.mark.parametrize("what", ["index", "value", "threshold", "count"])
def test_a_corrupted_backend_fails(what):
    rep = checks.Report(out=lambda line: None)
    checks.run_sweep(Corrupted(what), rep, [1000])
    assert rep.failures, f"a wrong {what} went unnoticed"


def test_sizes_and_the_bench_row():
    assert [checks.parse_size(s) for s in ("25M", "100M", "1k", "7")] == [25 * 10**6, 10**8, 1000, 7]
    assert checks.SWEEP_SIZES[0] == 1 and checks.SWEEP_SIZES[-1] == 100_000_000
    row = checks.bench_row(25_000_000, t_ms=0.2, t_torch=4.0, bw_gbps=3000.0)
    assert row["k"] == 25_000 and row["speedup_vs_torch"] == 20.0
    assert row["one_read_ms"] == pytest.approx(0.0333, abs=1e-4)  # 100 MB at 3 TB/s
    assert row["x_reads"] == pytest.approx(6.0, abs=0.01)
    assert row["fraction_of_bw"] == pytest.approx(1 / 6, abs=1e-3)
