// Input checks shared by the CPU and GPU top-k kernels (host side), and the CPU output writing.
#ifndef TF_COMMLIB_OPS_TOPK_TOPK_COMMON_H_
#define TF_COMMLIB_OPS_TOPK_TOPK_COMMON_H_

#include <cmath>
#include <limits>
#include <vector>

#include "common/checks.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_commlib {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
namespace errors = tensorflow::errors;

#define TFC_REGISTER_FLOAT_INDEX(R)                                            \
  R(float, int32_t) R(float, int64_t) R(Eigen::half, int32_t)                   \
  R(Eigen::half, int64_t) R(Eigen::bfloat16, int32_t) R(Eigen::bfloat16, int64_t)

// Reads the scalar k (input 1) and checks it against x. An empty x is fine: every selector
// returns min(k, size) entries, none for an empty x.
inline tensorflow::Status ReadK(tensorflow::OpKernelContext* ctx, const char* op,
                                const tensorflow::Tensor& x, int64_t* k) {
  const tensorflow::Tensor& kt = ctx->input(1);
  TF_RETURN_IF_ERROR(TensorRank(kt, 0, op, "k"));
  *k = kt.scalar<int64_t>()();
  if (*k <= 0) return tensorflow::errors::InvalidArgument(op, ": k must be positive, got ", *k);
  if (x.dims() == 0 && *k > 1)
    return tensorflow::errors::InvalidArgument(op, ": x is a scalar (rank 0) but k = ", *k);
  return tensorflow::OkStatus();
}

// Reads the scalar input i, called `name` in messages of `op`.
template <typename V>
tensorflow::Status ReadScalar(tensorflow::OpKernelContext* ctx, int i, const char* op,
                              const char* name, V* out) {
  TF_RETURN_IF_ERROR(TensorRank(ctx->input(i), 0, op, name));
  *out = ctx->input(i).scalar<V>()();
  return tensorflow::OkStatus();
}

// The ratios input of CommlibRatioCounts: a vector of at most `most` finite numbers.
inline tensorflow::Status CheckRatios(const tensorflow::Tensor& r, int64_t most) {
  TF_RETURN_IF_ERROR(TensorRank(r, 1, "ratio_counts", "ratios"));
  if (r.NumElements() > most)
    return tensorflow::errors::InvalidArgument("ratio_counts: at most ", most, " ratios, got ",
                                               r.NumElements());
  for (int64_t j = 0; j < r.NumElements(); ++j)
    if (!std::isfinite(r.vec<double>()(j)))
      return tensorflow::errors::InvalidArgument("ratio_counts: ratios[", j, "] is not finite");
  return tensorflow::OkStatus();
}

template <typename Tidx>
tensorflow::Status CheckIndexType(const char* op, int64_t d) {
  if (d > std::numeric_limits<Tidx>::max())
    return tensorflow::errors::InvalidArgument(op, ": x has ", d,
                                               " elements, too many for int32 indices (use int64)");
  return tensorflow::OkStatus();
}

inline tensorflow::Status CheckNan(const char* op, int64_t n_nan, bool allow_nan) {
  if (n_nan > 0 && !allow_nan)
    return tensorflow::errors::InvalidArgument(
        op, ": x contains ", n_nan, " NaN values (pass allow_nan=True to treat them as 0)");
  return tensorflow::OkStatus();
}

// Outputs 0 and 1: values x[idx] (NaN written as 0) and the indices.
template <typename T, typename Tidx>
tensorflow::Status WriteSelection(tensorflow::OpKernelContext* ctx, const T* x,
                                  const std::vector<int64_t>& idx) {
  const int64_t n = idx.size();
  tensorflow::Tensor *values = nullptr, *indices = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, {n}, &values));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, {n}, &indices));
  auto v = values->flat<T>();
  auto ix = indices->flat<Tidx>();
  for (int64_t i = 0; i < n; ++i) {
    const T xv = x[idx[i]];
    v(i) = xv != xv ? T(0) : xv;
    ix(i) = static_cast<Tidx>(idx[i]);
  }
  return tensorflow::OkStatus();
}

}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_TOPK_TOPK_COMMON_H_
