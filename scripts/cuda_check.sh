#!/usr/bin/env bash
# `make cuda-check`: compiles the CUDA kernels with nvcc, without TensorFlow and without a GPU.
#   1. every ops/**/*.cu.h through a one-line translation unit, for sm_80 and sm_90, and all of
#      them in two translation units linked together (one definition rule);
#   2. the standalone harness library (scripts/cuda_harness/harness.cu, which instantiates every
#      kernel for float/__half and int32/int64 indices) for sm_80 + sm_90;
#   3. when a TensorFlow is importable (.venv or python3), the TF functor files ops/**/*.cu.cc with
#      -DGOOGLE_CUDA=1 and TF's include flags, as setup.py does for a CUDA TensorFlow (CPU-only
#      TensorFlow ships the same Eigen headers, so this compiles but is never linked here), and
#      the CPU *.cc that register GPU kernels find every GpuDevice functor symbol they need.
# Warnings in our code are errors. Exits 0 with "skipped: nvcc not found" when nvcc is absent.
# The compiles run CUDA_CHECK_JOBS at a time (default: the number of CPUs); results print in order.
set -uo pipefail
cd "$(dirname "$0")/.."

NVCC=${NVCC:-nvcc}
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "cuda_check: skipped: nvcc not found"
  exit 0
fi
ARCHS=(sm_80 sm_90)
COMMON=(-std=c++17 -O2 -Iops -Xcompiler -Wall,-ffp-contract=off)
STRICT=(--Werror all-warnings)
JOBS=${CUDA_CHECK_JOBS:-$(nproc)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
labels=()
cmds=()

# run LABEL CMD...: starts a compile in the background (at most JOBS at once); its output goes to
# $tmp/log.<i>, its exit status to $tmp/rc.<i>, and `report` prints ok/FAIL in the order queued.
run() {
  local i=${#labels[@]}
  labels+=("$1")
  shift
  cmds+=("$*")
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  ( "$@" >"$tmp/log.$i" 2>&1; echo $? >"$tmp/rc.$i" ) &
}

# report: waits for the queued compiles and prints each one's result, with its output on failure.
report() {
  wait
  local i
  for i in "${!labels[@]}"; do
    if [ "$(cat "$tmp/rc.$i" 2>/dev/null)" = 0 ]; then
      echo "ok    ${labels[$i]}"
    else
      echo "FAIL  ${labels[$i]}"
      echo "      ${cmds[$i]}"
      sed 's/^/      | /' "$tmp/log.$i"
      failures=$((failures + 1))
    fi
  done
  labels=()
  cmds=()
}

echo "cuda_check: $("$NVCC" --version | tail -n 2 | head -n 1)"
mapfile -t headers < <(find ops -name '*.cu.h' | sort)
if [ "${#headers[@]}" -eq 0 ]; then
  echo "FAIL  no ops/**/*.cu.h found"
  exit 1
fi
gencode=()
for arch in "${ARCHS[@]}"; do gencode+=(-gencode "arch=compute_${arch#sm_},code=$arch"); done
# one nvcc call per header builds device code for every arch (one host pass instead of one per arch)
for h in "${headers[@]}"; do
  tu="$tmp/$(echo "${h#ops/}" | tr '/.' '__').cu"
  printf '#include "%s"\n#include "%s"  // include guard\n' "${h#ops/}" "${h#ops/}" >"$tu"
  run "$h (${ARCHS[*]})" "$NVCC" "${COMMON[@]}" "${STRICT[@]}" "${gencode[@]}" -c "$tu" -o "${tu%.cu}.o"
done

# The headers end up in several translation units of one library: two TUs including all of them
# must link (no non-inline, non-template definitions).
for h in "${headers[@]}"; do printf '#include "%s"\n' "${h#ops/}"; done >"$tmp/odr_a.cu"
{ cat "$tmp/odr_a.cu"; echo 'int main() { return 0; }'; } >"$tmp/odr_b.cu"
run "every *.cu.h in two linked translation units (sm_80)" \
  "$NVCC" "${COMMON[@]}" "${STRICT[@]}" -arch=sm_80 "$tmp/odr_a.cu" "$tmp/odr_b.cu" -o "$tmp/odr"

run "scripts/cuda_harness/harness.cu -> libtfc_harness.so (${ARCHS[*]})" \
  "$NVCC" "${COMMON[@]}" "${STRICT[@]}" -Xcompiler -fPIC "${gencode[@]}" -shared \
  scripts/cuda_harness/harness.cu -o "$tmp/libtfc_harness.so"

PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if tfflags=$("$PY" -c 'import tensorflow as tf; print(" ".join(tf.sysconfig.get_compile_flags()))' \
    2>/dev/null); then
  # --std=c++17 from TF is fine for nvcc; Eigen's own deprecation warnings are not ours.
  read -ra tfflags <<<"$tfflags"
  for src in $(find ops -name '*.cu.cc' | sort); do
    obj="$tmp/tf_$(echo "$src" | tr '/.' '__').o"
    run "$src (TensorFlow headers, -DGOOGLE_CUDA=1, sm_80)" \
      "$NVCC" "${tfflags[@]}" -Iops -DGOOGLE_CUDA=1 -x cu -Xcompiler -fPIC,-ffp-contract=off \
      -Wno-deprecated-declarations -O2 --expt-relaxed-constexpr -arch=sm_80 -c "$src" -o "$obj"
  done
fi
report   # every nvcc compile above has finished (the GPU functor symbols below come from them)

# cpu_functors SRC OUT: compiles a CPU file that registers GPU kernels under GOOGLE_CUDA and writes
# to OUT its result line (ok, FAIL with the functors no *.cu.cc instantiates, or skip).
cpu_functors() {
  local src=$1 out=$2 obj="$tmp/cpu_$(echo "$1" | tr '/.' '__').o" missing
  if g++ "${tfflags[@]}" -Iops -DGOOGLE_CUDA=1 -fPIC -O1 -Wno-deprecated-declarations -c "$src" \
      -o "$obj" >"$out.log" 2>&1; then
    missing=$(nm -u "$obj" | awk '{print $NF}' | grep tf_commlib | grep GpuDevice | grep -vxFf "$tmp/gpu_defined")
    if [ -z "$missing" ]; then
      echo "ok    $src: its GPU functors are instantiated by the *.cu.cc files" >"$out"
    else
      { echo "FAIL  $src uses GPU functors no *.cu.cc instantiates:"
        echo "$missing" | c++filt | sed 's/^/      | /'; } >"$out"
    fi
  else
    echo "skip  $src with -DGOOGLE_CUDA=1 does not compile against this (CPU) TensorFlow" >"$out"
  fi
}

if [ -n "${tfflags[*]:-}" ]; then
  : >"$tmp/gpu_defined"
  for obj in "$tmp"/tf_*.o; do
    [ -e "$obj" ] && nm --defined-only "$obj" | awk '{print $NF}' >>"$tmp/gpu_defined"
  done
  # The CPU files that register GPU kernels under GOOGLE_CUDA must find every GpuDevice functor
  # they use among the instantiations above.
  cpu_srcs=($(grep -l 'GOOGLE_CUDA' $(find ops -name '*.cc' ! -name '*.cu.cc') | sort))
  for i in "${!cpu_srcs[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    cpu_functors "${cpu_srcs[$i]}" "$tmp/cpu_result.$i" &
  done
  wait
  for i in "${!cpu_srcs[@]}"; do
    cat "$tmp/cpu_result.$i"
    grep -q '^FAIL' "$tmp/cpu_result.$i" && failures=$((failures + 1))
  done
else
  echo "skip  ops/**/*.cu.cc: no importable TensorFlow for its include flags"
fi

if [ "$failures" -ne 0 ]; then
  echo "cuda_check: $failures compile(s) FAILED"
  exit 1
fi
echo "cuda_check: all CUDA sources compile"
