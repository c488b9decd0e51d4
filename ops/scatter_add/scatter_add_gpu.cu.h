// CommlibScatterAdd on the GPU: dense[0:size] = 0, then dense[indices[i]] += values[i] with atomics.
// Plain CUDA, no TensorFlow: scatter_add_kernels.cu.cc and scripts/cuda_harness compile it.
//
// T is float or an IEEE binary16 type (__half, or Eigen::half once the TF functor marks it with
// GpuHalfLike). Out-of-range indices are skipped and raise *error (when error is not null).
// Repeated indices are summed in an unspecified order, so with repeats the result may differ from
// the sequential CPU kernel in the last bits (it is exact without repeats).
#ifndef TF_COMMLIB_OPS_SCATTER_ADD_SCATTER_ADD_GPU_CU_H_
#define TF_COMMLIB_OPS_SCATTER_ADD_SCATTER_ADD_GPU_CU_H_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace tf_commlib {
namespace gpu {

// 16-bit types stored as IEEE binary16 (bfloat16 is not: it must not go through __half atomics).
template <typename T>
struct GpuHalfLike : std::false_type {};
template <>
struct GpuHalfLike<__half> : std::true_type {};

__device__ __forceinline__ void AtomicAddHalf(__half* p, __half v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  atomicAdd(p, v);
#else  // CAS on the aligned 32-bit word holding *p; the float sum rounds to the correct half
  unsigned int* word = reinterpret_cast<unsigned int*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{3});
  const unsigned shift = (reinterpret_cast<uintptr_t>(p) & 2) ? 16 : 0;
  unsigned int old = *word, assumed;
  do {
    assumed = old;
    const __half cur = __ushort_as_half(static_cast<unsigned short>(assumed >> shift));
    const unsigned short sum = __half_as_ushort(__float2half_rn(__half2float(cur) + __half2float(v)));
    old = atomicCAS(word, assumed, (assumed & ~(0xffffu << shift)) | (unsigned{sum} << shift));
  } while (old != assumed);
#endif
}

__device__ __forceinline__ void AtomicAddValue(float* p, float v) { atomicAdd(p, v); }

template <typename T>
__device__ __forceinline__ void AtomicAddValue(T* p, T v) {
  static_assert(GpuHalfLike<T>::value, "scatter_add GPU: T must be float or an IEEE half type");
  static_assert(sizeof(T) == sizeof(__half), "scatter_add GPU: half type of the wrong size");
  __half h;
  memcpy(&h, &v, sizeof(h));  // same bits
  AtomicAddHalf(reinterpret_cast<__half*>(p), h);
}

template <typename T, typename Tidx>
__global__ void ScatterAddKernel(const Tidx* __restrict__ indices, const T* __restrict__ values,
                                 int64_t n, T* dense, int64_t size, int* error) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t j = static_cast<int64_t>(indices[i]);
    if (j < 0 || j >= size) {
      if (error != nullptr) atomicExch(error, 1);
      continue;
    }
    AtomicAddValue(dense + j, values[i]);
  }
}

// Queues the zero fill and the scatter on `stream`. error (device int, may be null) is cleared
// first and set to 1 if some index is outside [0, size); read it after the stream completes.
template <typename T, typename Tidx>
cudaError_t ScatterAdd(const Tidx* indices, const T* values, int64_t n, T* dense, int64_t size,
                       int* error, cudaStream_t stream) {
  if (error != nullptr) {
    const cudaError_t e = cudaMemsetAsync(error, 0, sizeof(int), stream);
    if (e != cudaSuccess) return e;
  }
  if (size > 0) {
    const cudaError_t e = cudaMemsetAsync(dense, 0, size * sizeof(T), stream);  // +0.0 bits
    if (e != cudaSuccess) return e;
  }
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)
    sms = 80;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 16LL * sms);
  ScatterAddKernel<T, Tidx><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      indices, values, n, dense, size, error);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_SCATTER_ADD_SCATTER_ADD_GPU_CU_H_
