// GPU functor of CommlibMstopk: gpu::Mstopk (mstopk_gpu.cu.h) on the op's stream.
//
// The GPU kernel is not registered yet: its op class belongs in mstopk_kernels.cc beside the CPU
// one (not changed here). It would declare MstopkGpuFunctor exactly as below (a TF-free header
// holding the declaration), allocate the min(k, d) value and index outputs and WorkspaceBytes(d)
// bytes of temp memory (DT_INT8), call the functor, raise CheckNan("mstopk", n_nan, false) when it
// reports NaN with allow_nan false, and write thresholds / counts (HostMemory outputs).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <cstdint>
#include <string>

#include "topk/mstopk_gpu.cu.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_commlib {

using GPUDevice = Eigen::GpuDevice;

template <typename T, typename Tidx>
struct MstopkGpuFunctor {
  // Bytes of device scratch for x of d entries.
  static int64_t WorkspaceBytes(int64_t d);
  // indices / values hold min(k, d) entries. Fills the host arrays thresholds[4] = {thres1, thres2,
  // mean, u}, counts[4] = {k1, k2, band start, n_inf} and *n_nan; selects nothing when x has NaN
  // and allow_nan is false. Synchronizes the stream a few times (the search runs on the host).
  // Returns "" or the CUDA error.
  std::string operator()(const GPUDevice& dev, const T* x, int64_t d, int64_t k, int num_samplings,
                         uint64_t seed, bool allow_nan, void* workspace, Tidx* indices, T* values,
                         double* thresholds, int64_t* counts, int64_t* n_nan) const;
};

template <typename T, typename Tidx>
int64_t MstopkGpuFunctor<T, Tidx>::WorkspaceBytes(int64_t d) {
  return static_cast<int64_t>(gpu::MstopkWorkspaceBytes(d));
}

template <typename T, typename Tidx>
std::string MstopkGpuFunctor<T, Tidx>::operator()(const GPUDevice& dev, const T* x, int64_t d,
                                                  int64_t k, int num_samplings, uint64_t seed,
                                                  bool allow_nan, void* workspace, Tidx* indices,
                                                  T* values, double* thresholds, int64_t* counts,
                                                  int64_t* n_nan) const {
  gpu::MstopkInfo info;
  const cudaError_t e = gpu::Mstopk(x, d, k, num_samplings, seed, allow_nan, workspace, indices,
                                    values, &info, dev.stream());
  if (e != cudaSuccess) return std::string("mstopk GPU kernel: ") + cudaGetErrorString(e);
  thresholds[0] = info.thres1;
  thresholds[1] = info.thres2;
  thresholds[2] = info.mean;
  thresholds[3] = info.u;
  counts[0] = info.k1;
  counts[1] = info.k2;
  counts[2] = info.start;
  counts[3] = info.n_inf;
  *n_nan = info.n_nan;
  return std::string();
}

template struct MstopkGpuFunctor<float, int32_t>;
template struct MstopkGpuFunctor<float, int64_t>;
template struct MstopkGpuFunctor<Eigen::half, int32_t>;
template struct MstopkGpuFunctor<Eigen::half, int64_t>;
template struct MstopkGpuFunctor<Eigen::bfloat16, int32_t>;
template struct MstopkGpuFunctor<Eigen::bfloat16, int64_t>;

}  // namespace tf_commlib

#endif  // GOOGLE_CUDA
