// CPU kernel of CommlibScatterAdd (and the GPU kernel registration when built with CUDA).
#define EIGEN_USE_THREADS
#include "scatter_add/scatter_add.h"

#include "unsupported/Eigen/CXX11/Tensor"

#include "common/checks.h"
#include "common/parallel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"

namespace tf_commlib {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using CPUDevice = Eigen::ThreadPoolDevice;
using GPUDevice = Eigen::GpuDevice;
namespace errors = tensorflow::errors;

template <typename Device, typename T, typename Tidx>
class ScatterAddOp : public OpKernel {
 public:
  explicit ScatterAddOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& indices = ctx->input(0);
    const Tensor& values = ctx->input(1);
    const Tensor& size_t_ = ctx->input(2);
    OP_REQUIRES_OK(ctx, TensorRank(indices, 1, "scatter_add", "indices"));
    OP_REQUIRES_OK(ctx, TensorRank(values, 1, "scatter_add", "values"));
    OP_REQUIRES(ctx, indices.NumElements() == values.NumElements(),
                errors::InvalidArgument("scatter_add: indices/values length mismatch: indices has ",
                                        indices.NumElements(), " elements, values has ",
                                        values.NumElements()));
    OP_REQUIRES_OK(ctx, TensorRank(size_t_, 0, "scatter_add", "size"));
    const int64_t size = size_t_.scalar<int64_t>()();
    OP_REQUIRES(ctx, size >= 0,
                errors::InvalidArgument("scatter_add: size must be non-negative, got ", size));
    const int64_t n = indices.NumElements();
    const Tidx* idx = indices.flat<Tidx>().data();
    if (std::is_same<Device, CPUDevice>::value) {
      for (int64_t i = 0; i < n; ++i) {
        OP_REQUIRES(ctx, idx[i] >= 0 && static_cast<int64_t>(idx[i]) < size,
                    errors::InvalidArgument("scatter_add: index out of range: indices[", i,
                                            "] = ", static_cast<int64_t>(idx[i]),
                                            " is not in [0, ", size, ")"));
      }
    }
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {size}, &dense));
    ScatterAddFunctor<Device, T, Tidx>()(ctx->eigen_device<Device>(), idx,
                                         values.flat<T>().data(), n, dense->flat<T>().data(), size);
  }
};

template <typename T, typename Tidx>
struct ScatterAddFunctor<CPUDevice, T, Tidx> {
  void operator()(const CPUDevice& d, const Tidx* indices, const T* values, int64_t n, T* dense,
                  int64_t size) {
    // Each shard owns a contiguous output range and adds, in input order, the values whose index
    // falls in it: the result equals a sequential numpy.add.at bit for bit, however many threads.
    const int64_t shards = std::max<int64_t>(1, std::min<int64_t>(d.numThreads(), size / kMinBlock));
    auto body = [&](int64_t s) {
      const int64_t lo = size * s / shards, hi = size * (s + 1) / shards;
      std::fill(dense + lo, dense + hi, T(0));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = static_cast<int64_t>(indices[i]);
        if (j >= lo && j < hi) dense[j] += values[i];
      }
    };
    if (shards == 1) {
      body(0);
    } else {
      d.parallelFor(shards, Eigen::TensorOpCost(0, 0, 1e9),
                    [&](Eigen::Index a, Eigen::Index b) {
                      for (Eigen::Index s = a; s < b; ++s) body(s);
                    });
    }
  }
};

#define REGISTER_CPU(T, Tidx)                                      \
  REGISTER_KERNEL_BUILDER(Name("CommlibScatterAdd")                \
                              .Device(tensorflow::DEVICE_CPU)      \
                              .TypeConstraint<T>("T")              \
                              .TypeConstraint<Tidx>("Tidx"),       \
                          ScatterAddOp<CPUDevice, T, Tidx>);
#define REGISTER_CPU_ALL(T) REGISTER_CPU(T, int32_t) REGISTER_CPU(T, int64_t)
REGISTER_CPU_ALL(float)
REGISTER_CPU_ALL(Eigen::half)
REGISTER_CPU_ALL(Eigen::bfloat16)

#if GOOGLE_CUDA
// On the GPU the indices are checked by the kernel itself (out-of-range entries are dropped).
#define REGISTER_GPU(T, Tidx)                                      \
  extern template struct ScatterAddFunctor<GPUDevice, T, Tidx>;    \
  REGISTER_KERNEL_BUILDER(Name("CommlibScatterAdd")                \
                              .Device(tensorflow::DEVICE_GPU)      \
                              .HostMemory("size")                  \
                              .TypeConstraint<T>("T")              \
                              .TypeConstraint<Tidx>("Tidx"),       \
                          ScatterAddOp<GPUDevice, T, Tidx>);
REGISTER_GPU(float, int32_t)
REGISTER_GPU(float, int64_t)
REGISTER_GPU(Eigen::half, int32_t)
REGISTER_GPU(Eigen::half, int64_t)
#endif

}  // namespace tf_commlib
