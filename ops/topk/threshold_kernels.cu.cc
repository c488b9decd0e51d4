// GPU functor of CommlibThresholdSelect: the compaction of select_gpu.cu.h on the op's stream.
//
// Not registered yet: the GPU op class belongs in threshold_kernels.cc (not changed here). It
// would declare ThresholdSelectGpuFunctor exactly as below, allocate WorkspaceBytes(d) bytes of
// temp memory, call Count (which syncs to learn the output size), raise on NaN unless allow_nan,
// allocate the n-entry outputs and call Write.
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <cstdint>
#include <string>

#include "topk/select_gpu.cu.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_commlib {

using GPUDevice = Eigen::GpuDevice;

template <typename T, typename Tidx>
struct ThresholdSelectGpuFunctor {
  static int64_t WorkspaceBytes(int64_t d);
  // Pass 1: *n = entries with |x| >= threshold (NaN read as 0), *n_nan = NaN entries. Syncs.
  std::string Count(const GPUDevice& dev, const T* x, int64_t d, double threshold, void* workspace,
                    int64_t* n, int64_t* n_nan) const;
  // Pass 2: the n entries in index order into indices / values (n entries each).
  std::string Write(const GPUDevice& dev, const T* x, int64_t d, double threshold, int64_t n,
                    const void* workspace, Tidx* indices, T* values) const;
};

template <typename T, typename Tidx>
int64_t ThresholdSelectGpuFunctor<T, Tidx>::WorkspaceBytes(int64_t d) {
  return static_cast<int64_t>(gpu::SelectWorkspaceBytes(d));
}

inline std::string CudaStatus(cudaError_t e) {
  return e == cudaSuccess ? std::string()
                          : std::string("threshold_select GPU kernel: ") + cudaGetErrorString(e);
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

template struct ThresholdSelectGpuFunctor<float, int32_t>;
template struct ThresholdSelectGpuFunctor<float, int64_t>;
template struct ThresholdSelectGpuFunctor<Eigen::half, int32_t>;
template struct ThresholdSelectGpuFunctor<Eigen::half, int64_t>;
template struct ThresholdSelectGpuFunctor<Eigen::bfloat16, int32_t>;
template struct ThresholdSelectGpuFunctor<Eigen::bfloat16, int64_t>;

}  // namespace tf_commlib

#endif  // GOOGLE_CUDA
