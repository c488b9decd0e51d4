#!/usr/bin/env bash
# Builds Horovod 0.28.1 against the TensorFlow of the virtualenv given as $1 (default .venv), which may
# be any environment that already has TensorFlow 2.21 (CPU or CUDA build). Gloo always; NCCL GPU
# operations when TensorFlow is a CUDA build and nvcc ($NVCC or PATH) and NCCL ($NCCL_HOME, the pip
# package nvidia-nccl-cu*, or the system's nccl.h) are found; MPI when mpicxx is on PATH. It needs no
# apt and no Slurm, and prints what it builds and what it left out. --dry-run prints the plan only.
# The source is PyPI's, with the patches of third_party/horovod_patches applied (each says what it
# fixes); the installed package lists them in horovod/tf_commlib_patches.txt, which tf_commlib reads.
# Skips the build when that Horovod already imports with TensorFlow support and those patches.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
venv=${1:-$root/.venv}
py=$venv/bin/python
[ -x "$py" ] || { echo "build_horovod: no python in $venv (give the virtualenv that has TensorFlow)" >&2; exit 2; }
"$py" -c 'import tensorflow' 2>/dev/null || {
  echo "build_horovod: $venv has no TensorFlow; install tensorflow (or tensorflow-cpu) 2.21 there first" >&2; exit 2; }
patches=$root/third_party/horovod_patches
patch_list=$(cd "$patches" && for p in *.patch; do echo "$p $(sha256sum < "$p" | cut -c1-16)"; done)
if [ $dry = 0 ] && "$py" -c '
import os, sys, horovod, horovod.tensorflow as h
assert h.gloo_built()
with open(os.path.join(os.path.dirname(horovod.__file__), "tf_commlib_patches.txt")) as f:
    assert f.read().strip() == sys.argv[1].strip()' "$patch_list" 2>/dev/null; then
  echo "horovod: already built in $venv"; exit 0
fi

plan="gloo"
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
       HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo HOROVOD_GPU_OPERATIONS= MAKEFLAGS="-j$(nproc)"
cuda_tf=$("$py" -c 'import tensorflow as tf; print(int(bool(tf.sysconfig.get_build_info().get("is_cuda_build"))))')
nvcc=${NVCC:-$(command -v nvcc || true)}
nccl_home=${NCCL_HOME:-$("$py" -c 'import os, nvidia.nccl as n; print(os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0])' 2>/dev/null || true)}
if [ -z "$nccl_home" ]; then
  for d in /usr /usr/local/cuda /usr/local/nccl; do [ -e "$d/include/nccl.h" ] && { nccl_home=$d; break; }; done
fi
if [ "$cuda_tf" = 1 ]; then
  if [ -z "$nvcc" ]; then
    echo "build_horovod: CUDA TensorFlow but no nvcc (\$NVCC or PATH): NCCL GPU operations left out"
  elif [ -z "$nccl_home" ] || [ ! -e "$nccl_home/include/nccl.h" ]; then
    echo "build_horovod: CUDA TensorFlow but no NCCL (\$NCCL_HOME, pip nvidia-nccl-cu12, or nccl.h): NCCL GPU operations left out"
  else
    export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=$nccl_home HOROVOD_CUDA_HOME=$(dirname "$(dirname "$nvcc")")
    plan="$plan nccl"
  fi
else
  echo "build_horovod: CPU TensorFlow: no GPU operations"
fi
if command -v mpicxx >/dev/null 2>&1; then
  export HOROVOD_WITH_MPI=1; unset HOROVOD_WITHOUT_MPI 2>/dev/null || true
  plan="$plan mpi"
else
  export HOROVOD_WITHOUT_MPI=1
  echo "build_horovod: no mpicxx on PATH: MPI left out (Gloo runs horovodrun and tfc_apps.slurm)"
fi
echo "horovod: building with $plan"
echo "horovod: patches $(cd "$patches" && echo *.patch)"
[ $dry = 1 ] && exit 0

tf_inc=$("$py" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())')
stubs=$root/third_party/horovod_xla_stubs
export CXXFLAGS="-I$stubs -I$tf_inc/external/highwayhash -I$tf_inc/external/farmhash_archive/src ${CXXFLAGS:-}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/pip" download --no-deps --no-binary :all: horovod==0.28.1 -d "$work"
tar xzf "$work/horovod-0.28.1.tar.gz" -C "$work"
for p in "$patches"/*.patch; do
  (cd "$work/horovod-0.28.1" && git apply -p1 "$p") || { echo "build_horovod: $p does not apply" >&2; exit 2; }
  echo "horovod: patched with $(basename "$p")"
done
"$venv/bin/pip" uninstall -y -q horovod 2>/dev/null || true
"$venv/bin/pip" install --no-build-isolation "$work/horovod-0.28.1"
pkg=$("$py" -c 'import os, horovod; print(os.path.dirname(horovod.__file__))')
echo "$patch_list" > "$pkg/tf_commlib_patches.txt"
"$py" -c 'import horovod.tensorflow as h; assert h.gloo_built()
print("horovod: built with gloo" + (", mpi" if h.mpi_built() else "") + (", nccl" if h.nccl_built() else ""))'
