// Rank checks that name the argument, for shape functions (graph construction) and kernels (run
// time, eager included). A kernel never calls .scalar() / .vec() on an input it has not checked:
// TensorFlow aborts the process on a wrong rank there.
#ifndef TF_COMMLIB_OPS_COMMON_CHECKS_H_
#define TF_COMMLIB_OPS_COMMON_CHECKS_H_

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_commlib {

// Shape function: input i (called `name` in messages of `op`) must have rank `rank` when known.
inline tensorflow::Status InputRank(tensorflow::shape_inference::InferenceContext* c, int i,
                                    int rank, const char* op, const char* name) {
  const auto s = c->input(i);
  if (c->RankKnown(s) && c->Rank(s) != rank)
    return tensorflow::errors::InvalidArgument(op, ": ", name, " must be ",
                                               rank == 0 ? "a scalar" : "a vector", ", got shape ",
                                               c->DebugString(s));
  return tensorflow::OkStatus();
}

// Kernel: the tensor must have rank `rank`.
inline tensorflow::Status TensorRank(const tensorflow::Tensor& t, int rank, const char* op,
                                     const char* name) {
  if (t.dims() != rank)
    return tensorflow::errors::InvalidArgument(op, ": ", name, " must be ",
                                               rank == 0 ? "a scalar" : "a vector", ", got shape ",
                                               t.shape().DebugString());
  return tensorflow::OkStatus();
}

}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_COMMON_CHECKS_H_
