// GPU functors of CommlibThresholdSelect (the compaction of select_gpu.cu.h) and of the NaN count of
// CommlibCheckSelection, on the op's stream (registered in threshold_kernels.cc, check_kernels.cc).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <cstdint>
#include <string>

#include "topk/gpu_functors.h"
#include "topk/select_gpu.cu.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_commlib {

using GPUDevice = Eigen::GpuDevice;

template <typename T, typename Tidx>
int64_t ThresholdSelectGpuFunctor<T, Tidx>::WorkspaceBytes(int64_t d) {
  return static_cast<int64_t>(gpu::SelectWorkspaceBytes(d));
}

inline std::string CudaStatus(cudaError_t e, const char* what = "threshold_select") {
  return e == cudaSuccess ? std::string()
                          : std::string(what) + " GPU kernel: " + cudaGetErrorString(e);
}

template <typename T, typename Tidx>
std::string ThresholdSelectGpuFunctor<T, Tidx>::Count(const GPUDevice& dev, const T* x, int64_t d,
                                                      double threshold, void* workspace,
                                                      int64_t* n, int64_t* n_nan) const {
  cudaError_t e = gpu::ThresholdSelectCount(x, d, threshold, true, workspace, dev.stream());
  if (e == cudaSuccess) e = gpu::ReadThresholdCount(workspace, d, n, n_nan, dev.stream());
  return CudaStatus(e);
}

template <typename T, typename Tidx>
std::string ThresholdSelectGpuFunctor<T, Tidx>::Write(const GPUDevice& dev, const T* x, int64_t d,
                                                      double threshold, int64_t n,
                                                      const void* workspace, Tidx* indices,
                                                      T* values) const {
  return CudaStatus(
      gpu::ThresholdSelectWrite(x, d, threshold, n, workspace, indices, values, dev.stream()));
}

template <typename T>
int64_t CountNanGpuFunctor<T>::WorkspaceBytes() {
  return sizeof(unsigned long long);
}

template <typename T>
std::string CountNanGpuFunctor<T>::operator()(const GPUDevice& dev, const T* x, int64_t d,
                                              void* workspace, int64_t* n) const {
  auto* count = static_cast<unsigned long long*>(workspace);
  unsigned long long host = 0;
  cudaError_t e = cudaMemsetAsync(count, 0, sizeof(*count), dev.stream());
  if (e == cudaSuccess && d > 0) {
    gpu::CountNanKernel<T><<<gpu::GridFor(d), gpu::kBlock, 0, dev.stream()>>>(x, d, count);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(&host, count, sizeof(host), cudaMemcpyDeviceToHost, dev.stream());
  if (e == cudaSuccess) e = cudaStreamSynchronize(dev.stream());
  *n = static_cast<int64_t>(host);
  return CudaStatus(e, "NaN count");
}

template struct CountNanGpuFunctor<float>;
template struct CountNanGpuFunctor<Eigen::half>;
template struct CountNanGpuFunctor<Eigen::bfloat16>;

template struct ThresholdSelectGpuFunctor<float, int32_t>;
template struct ThresholdSelectGpuFunctor<float, int64_t>;
template struct ThresholdSelectGpuFunctor<Eigen::half, int32_t>;
template struct ThresholdSelectGpuFunctor<Eigen::half, int64_t>;
template struct ThresholdSelectGpuFunctor<Eigen::bfloat16, int32_t>;
template struct ThresholdSelectGpuFunctor<Eigen::bfloat16, int64_t>;

}  // namespace tf_commlib

#endif  // GOOGLE_CUDA
