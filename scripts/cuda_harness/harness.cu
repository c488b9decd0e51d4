// Standalone C entry points over the very CUDA code the TensorFlow GPU kernels use
// (ops/**/*.cu.h), for a GPU machine without TensorFlow. All pointers are device pointers, except
// the small result arrays (host). Every function returns a cudaError_t (0 = success).
// Built by run_harness.py (and compile-checked by scripts/cuda_check.sh):
//   nvcc -std=c++17 -O3 -Iops -Xcompiler -fPIC,-ffp-contract=off -shared harness.cu -o libtfc_harness.so
#include <cstdint>

#include "scatter_add/scatter_add_gpu.cu.h"
#include "topk/mstopk_gpu.cu.h"

using tf_commlib::gpu::MstopkInfo;

namespace {

// thresholds[4] = thres1, thres2, mean, u; counts[6] = k1, k2, start, n_inf, n_nan, nan_rejected.
template <typename T, typename Tidx>
int RunMstopk(const T* x, int64_t d, int64_t k, int num_samplings, uint64_t seed, int allow_nan,
              void* workspace, Tidx* indices, T* values, double* thresholds, int64_t* counts,
              void* stream) {
  MstopkInfo info;
  const cudaError_t e =
      tf_commlib::gpu::Mstopk(x, d, k, num_samplings, seed, allow_nan != 0, workspace, indices,
                              values, &info, static_cast<cudaStream_t>(stream));
  const double t[4] = {info.thres1, info.thres2, info.mean, info.u};
  const int64_t c[6] = {info.k1, info.k2, info.start, info.n_inf, info.n_nan, info.nan_rejected};
  for (int i = 0; i < 4; ++i) thresholds[i] = t[i];
  for (int i = 0; i < 6; ++i) counts[i] = c[i];
  return e;
}

// indices / values must hold d entries; counts[2] (host) = {selected, NaN}. Synchronizes.
template <typename T>
int RunThresholdSelect(const T* x, int64_t d, double threshold, void* workspace, int64_t* indices,
                       T* values, int64_t* counts, void* stream) {
  namespace g = tf_commlib::gpu;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e = g::ThresholdSelectCount(x, d, threshold, /*count_nan=*/true, workspace, s);
  if (e == cudaSuccess) e = g::ReadThresholdCount(workspace, d, &counts[0], &counts[1], s);
  if (e == cudaSuccess)
    e = g::ThresholdSelectWrite(x, d, threshold, counts[0], workspace, indices, values, s);
  return e;
}

// *count (host) = the number of NaN in x (the check of CommlibCheckSelection); workspace: 8 bytes.
// Synchronizes.
template <typename T>
int RunCountNan(const T* x, int64_t d, void* workspace, int64_t* count, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto* c = static_cast<unsigned long long*>(workspace);
  unsigned long long host = 0;
  cudaError_t e = cudaMemsetAsync(c, 0, sizeof(*c), s);
  if (e == cudaSuccess && d > 0) {
    tf_commlib::gpu::CountNanKernel<T>
        <<<tf_commlib::gpu::GridFor(d), tf_commlib::gpu::kBlock, 0, s>>>(x, d, c);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpyAsync(&host, c, sizeof(host), cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  *count = static_cast<int64_t>(host);
  return e;
}

}  // namespace

extern "C" {

const char* tfc_error_string(int e) { return cudaGetErrorString(static_cast<cudaError_t>(e)); }

int64_t tfc_mstopk_workspace_bytes(int64_t d) {
  return static_cast<int64_t>(tf_commlib::gpu::MstopkWorkspaceBytes(d));
}
int64_t tfc_select_workspace_bytes(int64_t d) {
  return static_cast<int64_t>(tf_commlib::gpu::SelectWorkspaceBytes(d));
}

#define TFC_MSTOPK(NAME, T, TIDX)                                                            \
  int NAME(const T* x, int64_t d, int64_t k, int num_samplings, uint64_t seed, int allow_nan, \
           void* ws, TIDX* indices, T* values, double* thresholds, int64_t* counts,          \
           void* stream) {                                                                   \
    return RunMstopk(x, d, k, num_samplings, seed, allow_nan, ws, indices, values,           \
                     thresholds, counts, stream);                                            \
  }
TFC_MSTOPK(tfc_mstopk_f32_i64, float, int64_t)
TFC_MSTOPK(tfc_mstopk_f32_i32, float, int32_t)
TFC_MSTOPK(tfc_mstopk_f16_i64, __half, int64_t)
#undef TFC_MSTOPK

int tfc_threshold_select_f32(const float* x, int64_t d, double t, void* ws, int64_t* indices,
                             float* values, int64_t* counts, void* stream) {
  return RunThresholdSelect(x, d, t, ws, indices, values, counts, stream);
}
int tfc_threshold_select_f16(const __half* x, int64_t d, double t, void* ws, int64_t* indices,
                             __half* values, int64_t* counts, void* stream) {
  return RunThresholdSelect(x, d, t, ws, indices, values, counts, stream);
}

int tfc_count_nan_f32(const float* x, int64_t d, void* ws, int64_t* count, void* stream) {
  return RunCountNan(x, d, ws, count, stream);
}
int tfc_count_nan_f16(const __half* x, int64_t d, void* ws, int64_t* count, void* stream) {
  return RunCountNan(x, d, ws, count, stream);
}

// err: a device int, set to 1 when an index is outside [0, size).
#define TFC_SCATTER(NAME, T, TIDX)                                                          \
  int NAME(const TIDX* indices, const T* values, int64_t n, T* dense, int64_t size, int* err, \
           void* stream) {                                                                  \
    return tf_commlib::gpu::ScatterAdd(indices, values, n, dense, size, err,                \
                                       static_cast<cudaStream_t>(stream));                  \
  }
TFC_SCATTER(tfc_scatter_add_f32_i32, float, int32_t)
TFC_SCATTER(tfc_scatter_add_f32_i64, float, int64_t)
TFC_SCATTER(tfc_scatter_add_f16_i32, __half, int32_t)
TFC_SCATTER(tfc_scatter_add_f16_i64, __half, int64_t)
#undef TFC_SCATTER

int tfc_synchronize(void* stream) { return cudaStreamSynchronize(static_cast<cudaStream_t>(stream)); }

}  // extern "C"
