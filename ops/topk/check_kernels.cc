// Kernels of CommlibCheckSelection: the input checks of the selectors written with TensorFlow ops.
#define EIGEN_USE_THREADS
#include <algorithm>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "topk/abs_passes.h"
#include "topk/topk_common.h"
#if GOOGLE_CUDA
#include "topk/gpu_functors.h"
#endif

namespace tf_commlib {

// Counts the NaN of x on the kernel's device.
template <typename Device, typename T>
struct NanCounter;

template <typename T>
struct NanCounter<Eigen::ThreadPoolDevice, T> {
  tensorflow::Status operator()(OpKernelContext* ctx, const T* x, int64_t d, int64_t* n) const {
    *n = CountNan(ctx, x, d);
    return tensorflow::OkStatus();
  }
};

template <typename Device, typename T>
class CheckSelectionOp : public OpKernel {
 public:
  explicit CheckSelectionOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("op_name", &op_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("allow_nan", &allow_nan_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& xt = ctx->input(0);
    int64_t k;
    OP_REQUIRES_OK(ctx, ReadK(ctx, op_.c_str(), xt, &k));
    const int64_t d = xt.NumElements();
    if (!allow_nan_ && d > 0) {
      int64_t n_nan = 0;
      OP_REQUIRES_OK(ctx, NanCounter<Device, T>()(ctx, xt.flat<T>().data(), d, &n_nan));
      OP_REQUIRES_OK(ctx, CheckNan(op_.c_str(), n_nan, false));
    }
    Tensor* n = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {}, &n));
    n->scalar<int64_t>()() = std::min(k, d);
  }

 private:
  std::string op_;
  bool allow_nan_;
};

#define REGISTER(T)                                                                       \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("CommlibCheckSelection").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      CheckSelectionOp<Eigen::ThreadPoolDevice, T>);
REGISTER(float)
REGISTER(Eigen::half)
REGISTER(Eigen::bfloat16)
#undef REGISTER

#if GOOGLE_CUDA
template <typename T>
struct NanCounter<Eigen::GpuDevice, T> {
  tensorflow::Status operator()(OpKernelContext* ctx, const T* x, int64_t d, int64_t* n) const {
    Tensor scratch;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT8,
                                          {CountNanGpuFunctor<T>::WorkspaceBytes()}, &scratch));
    const std::string err = CountNanGpuFunctor<T>()(ctx->eigen_device<Eigen::GpuDevice>(), x, d,
                                                    scratch.flat<int8_t>().data(), n);
    if (!err.empty()) return tensorflow::errors::Internal(err);
    return tensorflow::OkStatus();
  }
};

// x stays on the GPU (only its NaN are counted there); k and n live in host memory.
#define REGISTER_GPU(T)                                                       \
  extern template struct CountNanGpuFunctor<T>;                               \
  REGISTER_KERNEL_BUILDER(Name("CommlibCheckSelection")                       \
                              .Device(tensorflow::DEVICE_GPU)                 \
                              .HostMemory("k")                                \
                              .HostMemory("n")                                \
                              .TypeConstraint<T>("T"),                        \
                          CheckSelectionOp<Eigen::GpuDevice, T>);
REGISTER_GPU(float)
REGISTER_GPU(Eigen::half)
REGISTER_GPU(Eigen::bfloat16)
#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace tf_commlib
