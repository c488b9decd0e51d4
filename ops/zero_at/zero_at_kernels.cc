// CPU kernel of CommlibZeroAt. TensorFlow's own scatter ops on a resource variable switch it to
// copy-on-read mode, after which every read copies the whole variable; this kernel writes in place
// under the variable's lock, copying first only while a read still shares the buffer (as an
// assign would), and leaves the variable's mode alone.
#include <cstring>

#include "common/checks.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace tf_commlib {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
namespace errors = tensorflow::errors;

template <typename T, typename Tidx>
class ZeroAtOp : public OpKernel {
 public:
  explicit ZeroAtOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& indices = ctx->input(1);
    OP_REQUIRES_OK(ctx, TensorRank(indices, 1, "zero_at", "indices"));
    tensorflow::core::RefCountPtr<tensorflow::Var> var;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), &var));
    tensorflow::mutex_lock lock(*var->mu());
    Tensor* t = var->tensor();
    OP_REQUIRES(ctx, var->is_initialized && t->IsInitialized(),
                errors::FailedPrecondition("zero_at: the variable is not initialized"));
    OP_REQUIRES(ctx, t->dtype() == tensorflow::DataTypeToEnum<T>::value,
                errors::InvalidArgument("zero_at: the variable's dtype is ",
                                        tensorflow::DataTypeString(t->dtype()), ", not ",
                                        tensorflow::DataTypeString(tensorflow::DataTypeToEnum<T>::value)));
    const int64_t size = t->NumElements(), n = indices.NumElements();
    const Tidx* idx = indices.flat<Tidx>().data();
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, idx[i] >= 0 && static_cast<int64_t>(idx[i]) < size,
                  errors::InvalidArgument("zero_at: index out of range: indices[", i, "] = ",
                                          static_cast<int64_t>(idx[i]), " is not in [0, ", size, ")"));
    }
    if (n == 0) return;
    if (!t->RefCountIsOne()) {   // a read still holds this buffer: write into a copy
      Tensor copy;
      tensorflow::AllocatorAttributes attr;
      attr.set_gpu_compatible(true);
      attr.set_nic_compatible(true);
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(t->dtype(), t->shape(), &copy, attr));
      if (size > 0) std::memcpy(copy.flat<T>().data(), t->flat<T>().data(), size * sizeof(T));
      *t = copy;
    }
    T* data = t->flat<T>().data();
    for (int64_t i = 0; i < n; ++i) data[idx[i]] = T(0);
  }
};

#define REGISTER_CPU(T, Tidx)                                  \
  REGISTER_KERNEL_BUILDER(Name("CommlibZeroAt")                \
                              .Device(tensorflow::DEVICE_CPU)  \
                              .TypeConstraint<T>("dtype")      \
                              .TypeConstraint<Tidx>("Tidx"),   \
                          ZeroAtOp<T, Tidx>);
#define REGISTER_CPU_ALL(T) REGISTER_CPU(T, int32_t) REGISTER_CPU(T, int64_t)
REGISTER_CPU_ALL(float)
REGISTER_CPU_ALL(double)
REGISTER_CPU_ALL(Eigen::half)
REGISTER_CPU_ALL(Eigen::bfloat16)

}  // namespace tf_commlib
