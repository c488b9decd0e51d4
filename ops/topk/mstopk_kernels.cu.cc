// GPU functor of CommlibMstopk (registered in mstopk_kernels.cc under GOOGLE_CUDA): gpu::Mstopk
// (mstopk_gpu.cu.h) on the op's stream.
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <cstdint>
#include <string>

#include "topk/gpu_functors.h"
#include "topk/mstopk_gpu.cu.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_commlib {

using GPUDevice = Eigen::GpuDevice;

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
