"""Build and install tf_commlib and datacache.

``build_ext`` compiles two op libraries with TensorFlow's flags, each with a ``_build_info.json``
beside it (TensorFlow version and source hash, checked by the package's loader):

* ``tf_commlib/_tf_commlib_ops*.so``: ``ops/**/*.cc`` except ``ops/datacache``. CUDA sources
  (``*.cu.cc``) are compiled with nvcc (``$NVCC`` or the one on PATH) and linked in, with the static
  CUDA runtime, only when the installed TensorFlow is a CUDA build and nvcc is found, so a CPU
  install never needs a GPU toolchain.
* ``datacache/_datacache_ops*.so``: ``ops/datacache`` (DatacacheMget, linked with ISA-L for CRC32).
"""
import importlib.util
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

from tf_commlib import _sources as tf_commlib_sources

ROOT = Path(__file__).resolve().parent
OPS = ROOT / "ops"


def _datacache_sources():
    """datacache/_sources.py, loaded by path: importing the datacache package would import TensorFlow."""
    spec = importlib.util.spec_from_file_location("_datacache_sources", ROOT / "datacache" / "_sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Per library: its package, how its loader lists and hashes its sources, whether it may take CUDA
# kernels, and extra link flags.
LIBRARIES = {
    "tf_commlib._tf_commlib_ops": dict(package="tf_commlib", sources=tf_commlib_sources, cuda=True, libs=[]),
    "datacache._datacache_ops": dict(package="datacache", sources=_datacache_sources(), cuda=False,
                                     libs=["-lisal"]),   # ISA-L: the CRC32 of DatacacheMget
}


# Machine code for sm_80 (A100) and sm_90 (H100), and PTX of sm_90 that newer GPUs compile when loading.
CUDA_ARCHS = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
              "-gencode", "arch=compute_90,code=compute_90"]


def cpu_level():
    """x86-64-v3 (AVX2) when the building machine has it: the library is built where it runs."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "x86-64-v2"
    return "x86-64-v3" if " avx2" in flags and " fma" in flags else "x86-64-v2"


class BuildOps(build_ext):
    """Compiles the op library with g++ (and nvcc for a CUDA TensorFlow) instead of distutils."""

    def finalize_options(self):
        super().finalize_options()
        self.force = True  # the extension lists no sources for distutils to compare dates with

    def build_extension(self, ext):
        try:
            import tensorflow as tf
        except ImportError as e:
            raise RuntimeError("tf_commlib builds its op libraries against the TensorFlow of the environment it "
                               "installs into, which has none: install tensorflow (or tensorflow-cpu) 2.21 there "
                               "first, then `pip install --no-build-isolation .` (an isolated build cannot see "
                               f"it): {e}") from e

        lib = LIBRARIES[ext.name]
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        objdir = ROOT / "build" / "ops" / lib["package"]
        objdir.mkdir(parents=True, exist_ok=True)
        cuda = lib["cuda"] and bool(tf.sysconfig.get_build_info().get("is_cuda_build"))
        nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
        if cuda and not nvcc:
            print(f"{lib['package']}: CUDA TensorFlow but no nvcc ($NVCC or PATH): CPU kernels only")
            cuda = False
        sources = lib["sources"].op_sources(OPS, cuda)
        cflags = tf.sysconfig.get_compile_flags() + [f"-I{OPS}", "-O3", "-fPIC", "-std=c++17",
                                                  "-Wno-deprecated-declarations", "-ffp-contract=off"]
        if cuda:
            cflags += ["-DGOOGLE_CUDA=1"]
        jobs = []
        for src in sources:
            if src.suffix != ".cc" or src.name.endswith(".cu.cc"):
                continue
            obj = objdir / (str(src.relative_to(OPS)).replace("/", "__") + ".o")
            jobs.append(["g++", *cflags, f"-march={cpu_level()}", "-c", str(src), "-o", str(obj)])
        if cuda:
            # nvcc takes -I/-D/-std itself; host-compiler flags (fp-contract off keeps the float64
            # threshold arithmetic identical to the CPU kernels) go through -Xcompiler.
            nvflags = [f for f in cflags if f.startswith(("-I", "-D"))] + ["-std=c++17"]
            nvflags += ["-Xcompiler", "-ffp-contract=off", "-fmad=false", *CUDA_ARCHS]
            for src in (p for p in sources if p.name.endswith(".cu.cc")):
                obj = objdir / (str(src.relative_to(OPS)).replace("/", "__") + ".o")
                jobs.append([nvcc, *nvflags, "-x", "cu", "-Xcompiler", "-fPIC", "-O3",
                             "--expt-relaxed-constexpr", "-c", str(src), "-o", str(obj)])
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            for cmd, rc in zip(jobs, pool.map(lambda c: subprocess.call(c), jobs)):
                if rc != 0:
                    raise RuntimeError(f"{lib['package']} op library build failed: " + " ".join(cmd))
        objs = [j[j.index("-o") + 1] for j in jobs]
        link = ["g++", "-shared", "-o", str(out), *objs, *tf.sysconfig.get_link_flags(), *lib["libs"]]
        if cuda:  # the static runtime: nothing to find at load time, no GPU needed to load
            cuda_lib = Path(nvcc).resolve().parents[1] / "lib64"
            link += [f"-L{cuda_lib}", "-lcudart_static", "-ldl", "-lrt", "-lpthread"]
        subprocess.check_call(link)
        info = {"tensorflow": tf.__version__, "cuda": cuda, "sources": lib["sources"].source_hash(OPS, cuda),
                "library": out.name}
        (out.parent / "_build_info.json").write_text(json.dumps(info, indent=1) + "\n")

    def copy_extensions_to_source(self):
        super().copy_extensions_to_source()  # --inplace / editable: the libraries go beside the code
        for lib in LIBRARIES.values():
            info = Path(self.build_lib) / lib["package"] / "_build_info.json"
            (ROOT / lib["package"] / "_build_info.json").write_text(info.read_text())

setup(
    name="tf_commlib",
    version="0.1.0",
    description="Communication-efficient data-parallel training for TensorFlow + Horovod "
                "(MSTopK, HiTopKComm, DGC, RedSync, SparCML)",
    packages=find_packages(include=["tf_commlib", "tf_commlib.*", "datacache", "datacache.*", "tfc_apps", "tfc_apps.*",
                                    "pto", "pto.*"]),
    entry_points={"console_scripts": ["datacache = datacache.cli:main"]},
    python_requires=">=3.11",
    ext_modules=[Extension(name, sources=[]) for name in LIBRARIES],
    cmdclass={"build_ext": BuildOps},
    package_data={"tf_commlib": ["_build_info.json", "_tf_commlib_ops*.so"],
                  "datacache": ["_build_info.json", "_datacache_ops*.so"]},
)
