// Declarations of the GPU functors of the top-k ops, shared by the op classes (*.cc, compiled by
// g++ under GOOGLE_CUDA) and their definitions (*.cu.cc, nvcc). No CUDA types here: the op
// classes pass ctx->eigen_device<Eigen::GpuDevice>() and the functors take its stream.
// Every functor returns "" or the CUDA error as text.
#ifndef TF_COMMLIB_OPS_TOPK_GPU_FUNCTORS_H_
#define TF_COMMLIB_OPS_TOPK_GPU_FUNCTORS_H_

#include <cstdint>
#include <string>

#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_commlib {

// MSTopK (mstopk_gpu.cu.h), for d > 0 entries of x.
template <typename T, typename Tidx>
struct MstopkGpuFunctor {
  // Bytes of device scratch for x of d entries.
  static int64_t WorkspaceBytes(int64_t d);
  // indices / values hold min(k, d) entries. Fills the host arrays thresholds[4] = {thres1,
  // thres2, mean, u}, counts[4] = {k1, k2, band start, n_inf} and *n_nan; selects nothing when x
  // has NaN and allow_nan is false. Synchronizes the stream a few times (the search runs on the
  // host); the selection is left queued on the stream.
  std::string operator()(const Eigen::GpuDevice& dev, const T* x, int64_t d, int64_t k,
                         int num_samplings, uint64_t seed, bool allow_nan, void* workspace,
                         Tidx* indices, T* values, double* thresholds, int64_t* counts,
                         int64_t* n_nan) const;
};

// threshold_select (select_gpu.cu.h): the entries with |x| >= threshold in index order.
template <typename T, typename Tidx>
struct ThresholdSelectGpuFunctor {
  static int64_t WorkspaceBytes(int64_t d);
  // Pass 1: *n = entries with |x| >= threshold (NaN read as 0), *n_nan = NaN entries. Syncs.
  std::string Count(const Eigen::GpuDevice& dev, const T* x, int64_t d, double threshold,
                    void* workspace, int64_t* n, int64_t* n_nan) const;
  // Pass 2: the n entries in index order into indices / values (n entries each).
  std::string Write(const Eigen::GpuDevice& dev, const T* x, int64_t d, double threshold,
                    int64_t n, const void* workspace, Tidx* indices, T* values) const;
};

// *n = the number of NaN in x. Syncs.
template <typename T>
struct CountNanGpuFunctor {
  static int64_t WorkspaceBytes();
  std::string operator()(const Eigen::GpuDevice& dev, const T* x, int64_t d, void* workspace,
                         int64_t* n) const;
};

}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_TOPK_GPU_FUNCTORS_H_
