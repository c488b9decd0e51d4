// GPU functor of CommlibScatterAdd (registered in scatter_add_kernels.cc under GOOGLE_CUDA): the
// kernels of scatter_add_gpu.cu.h queued on the op's stream.
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include "scatter_add/scatter_add.h"
#include "scatter_add/scatter_add_gpu.cu.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_commlib {
namespace gpu {
template <>
struct GpuHalfLike<Eigen::half> : std::true_type {};  // IEEE binary16, like __half
}  // namespace gpu

using GPUDevice = Eigen::GpuDevice;

// Out-of-range indices are dropped (the op cannot report them without a device-to-host copy and
// a stream sync; the CPU kernel checks them and raises). Repeated indices add in any order.
template <typename T, typename Tidx>
struct ScatterAddFunctor<GPUDevice, T, Tidx> {
  void operator()(const GPUDevice& d, const Tidx* indices, const T* values, int64_t n, T* dense,
                  int64_t size) {
    // An error here is a launch failure of the stream; TF reports it on the next sync.
    (void)gpu::ScatterAdd(indices, values, n, dense, size, /*error=*/nullptr, d.stream());
  }
};

template struct ScatterAddFunctor<GPUDevice, float, int32_t>;
template struct ScatterAddFunctor<GPUDevice, float, int64_t>;
template struct ScatterAddFunctor<GPUDevice, Eigen::half, int32_t>;
template struct ScatterAddFunctor<GPUDevice, Eigen::half, int64_t>;

}  // namespace tf_commlib

#endif  // GOOGLE_CUDA
