#!/usr/bin/env bash
# Builds Horovod 0.28.1 (TensorFlow, Gloo, CPU) into the virtualenv given as $1 (default .venv).
# Skips the build when that Horovod already imports with TensorFlow support.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv}
py=$venv/bin/python
if "$py" -c 'import horovod.tensorflow as h; assert h.gloo_built()' 2>/dev/null; then
  echo "horovod: already built in $venv"; exit 0
fi
tf_inc=$("$py" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())')
stubs=$root/third_party/horovod_xla_stubs
export CXXFLAGS="-I$stubs -I$tf_inc/external/highwayhash -I$tf_inc/external/farmhash_archive/src ${CXXFLAGS:-}"
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
       HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=gloo HOROVOD_GPU_OPERATIONS= \
       MAKEFLAGS="-j$(nproc)"
"$venv/bin/pip" install --no-build-isolation --no-binary horovod horovod==0.28.1
"$py" -c 'import horovod.tensorflow as h; assert h.gloo_built(); print("horovod: built with gloo")'
