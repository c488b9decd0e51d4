"""ctypes binding of libtfc_harness.so (harness.cu) for CuPy arrays, and its nvcc build.

Every call takes device arrays (CuPy) and runs on CuPy's current stream; see run_harness.py.
"""
import ctypes as C
import subprocess
from pathlib import Path

import cupy as cp
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def build(nvcc):
    out = HERE / "build" / "libtfc_harness.so"
    sources = [HERE / "harness.cu", *ROOT.glob("ops/**/*.cu.h"), *ROOT.glob("ops/**/*.h")]
    if out.exists() and out.stat().st_mtime > max(p.stat().st_mtime for p in sources):
        return out
    cc = "".join(map(str, cp.cuda.Device().compute_capability))
    out.parent.mkdir(exist_ok=True)
    cmd = [nvcc, "-std=c++17", "-O3", f"-I{ROOT / 'ops'}", "-Xcompiler", "-fPIC,-ffp-contract=off",
           f"-gencode=arch=compute_{cc},code=sm_{cc}", "-shared", str(HERE / "harness.cu"),
           "-o", str(out)]
    print("building:", " ".join(cmd), flush=True)
    subprocess.check_call(cmd)
    return out


class Lib:
    def __init__(self, path):
        L = self.L = C.CDLL(str(path))
        P, I64, D, I = C.c_void_p, C.c_int64, C.c_double, C.c_int
        for n in ("f32_i64", "f32_i32", "f16_i64"):
            getattr(L, "tfc_mstopk_" + n).argtypes = [P, I64, I64, I, C.c_uint64, I, P, P, P,
                                                      C.POINTER(D), C.POINTER(I64), P]
        for n in ("f32", "f16"):
            getattr(L, "tfc_threshold_select_" + n).argtypes = [P, I64, D, P, P, P,
                                                               C.POINTER(I64), P]
        for n in ("f32", "f16"):
            getattr(L, "tfc_count_nan_" + n).argtypes = [P, I64, P, C.POINTER(I64), P]
        for n in ("f32_i32", "f32_i64", "f16_i32", "f16_i64"):
            getattr(L, "tfc_scatter_add_" + n).argtypes = [P, P, I64, P, I64, P, P]
        L.tfc_mstopk_workspace_bytes.argtypes = L.tfc_select_workspace_bytes.argtypes = [I64]
        L.tfc_mstopk_workspace_bytes.restype = L.tfc_select_workspace_bytes.restype = I64
        L.tfc_error_string.restype = C.c_char_p

    def ok(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: CUDA error {rc}: {self.L.tfc_error_string(rc).decode()}")

    @staticmethod
    def stream():
        return C.c_void_p(cp.cuda.get_current_stream().ptr)

    def mstopk(self, x, k, ns=30, seed=0, allow_nan=False, tidx=np.int64, ws=None, out=None):
        d = x.size
        kk = min(k, d)
        idx, val = out if out else (cp.empty(kk, tidx), cp.empty(kk, x.dtype))
        ws = cp.empty(self.L.tfc_mstopk_workspace_bytes(d), cp.uint8) if ws is None else ws
        thr, cnt = (C.c_double * 4)(), (C.c_int64 * 6)()
        name = {np.float32: "f32", np.float16: "f16"}[x.dtype.type] + \
            {np.int64: "_i64", np.int32: "_i32"}[np.dtype(tidx).type]
        rc = getattr(self.L, "tfc_mstopk_" + name)(x.data.ptr, d, k, ns, seed, int(allow_nan),
                                                    ws.data.ptr, idx.data.ptr, val.data.ptr,
                                                    thr, cnt, self.stream())
        self.ok(rc, "mstopk")
        return idx, val, list(thr), list(cnt)

    def threshold_select(self, x, t):
        d = x.size
        idx, val = cp.empty(d, cp.int64), cp.empty(d, x.dtype)
        ws = cp.empty(self.L.tfc_select_workspace_bytes(d), cp.uint8)
        cnt = (C.c_int64 * 2)()
        name = "tfc_threshold_select_" + {np.float32: "f32", np.float16: "f16"}[x.dtype.type]
        self.ok(getattr(self.L, name)(x.data.ptr, d, t, ws.data.ptr, idx.data.ptr, val.data.ptr,
                                      cnt, self.stream()), "threshold_select")
        return idx[:cnt[0]], val[:cnt[0]], cnt[1]

    def count_nan(self, x):
        ws, n = cp.empty(8, cp.uint8), C.c_int64()
        name = "tfc_count_nan_" + {np.float32: "f32", np.float16: "f16"}[x.dtype.type]
        self.ok(getattr(self.L, name)(x.data.ptr, x.size, ws.data.ptr, C.byref(n), self.stream()),
                "count_nan")
        return n.value

    def scatter_add(self, idx, vals, size):
        dense, err = cp.empty(size, vals.dtype), cp.zeros(1, cp.int32)
        name = "tfc_scatter_add_" + {np.float32: "f32", np.float16: "f16"}[vals.dtype.type] + \
            {np.int64: "_i64", np.int32: "_i32"}[idx.dtype.type]
        self.ok(getattr(self.L, name)(idx.data.ptr, vals.data.ptr, idx.size, dense.data.ptr, size,
                                      err.data.ptr, self.stream()), "scatter_add")
        return dense, int(err.get()[0])
