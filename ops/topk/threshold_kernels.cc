// CPU kernels of CommlibThresholdSearch, CommlibThresholdSelect and CommlibRatioCounts, and the
// GPU kernel of CommlibThresholdSelect when built with CUDA (ThresholdSelectGpuFunctor).
#define EIGEN_USE_THREADS
#include "tensorflow/core/framework/op_kernel.h"
#include "topk/probe_engine.h"
#include "topk/topk_common.h"
#if GOOGLE_CUDA
#include "topk/gpu_functors.h"
#endif

namespace tf_commlib {

template <typename T, typename Tidx>
class ThresholdSearchOp : public OpKernel {
 public:
  explicit ThresholdSearchOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("allow_nan", &allow_nan_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& xt = ctx->input(0);
    int64_t k;
    OP_REQUIRES_OK(ctx, ReadK(ctx, "threshold_search", xt, &k));
    const int64_t d = xt.NumElements();
    OP_REQUIRES_OK(ctx, CheckIndexType<Tidx>("threshold_search", d));
    const T* x = xt.flat<T>().data();
    if (d == 0) {  // nothing to select, threshold 0
      OP_REQUIRES_OK(ctx, WriteSelection<T, Tidx>(ctx, x, {}));
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, {}, &out));
      out->scalar<double>()() = 0.0;
      return;
    }
    ProbeEngine<T> engine(ctx, x, d, std::min(2 * k, d));
    OP_REQUIRES_OK(ctx, CheckNan("threshold_search", engine.stats().n_nan, allow_nan_));
    // Search on the ratio (RedSync prints thresholds and k/2 here; NOTES.md): stop at the first
    // probe with k <= count < 2k. Ties can make that window empty: then keep the lowest probe
    // with count >= k, or the mean, or 0 (everything), whichever first has k entries.
    double threshold = 0.0;
    if (k < d) {
      double l = 0.0, r = 1.0, best = -1.0;
      for (int i = 0; i < kMaxSamplings; ++i) {
        const double ratio = l + (r - l) / 2;
        bool exact;  // an inexact count is known to be >= 2k, which is all the search needs
        const int64_t nnz = engine.CountAbove(ratio, 2 * k - 1, &exact);
        if (nnz < k) {
          r = ratio;
        } else if (nnz >= 2 * k) {
          l = ratio;
          best = ratio;
        } else {
          best = ratio;
          break;
        }
      }
      if (best >= 0) {
        threshold = Threshold(engine.mean(), engine.u(), best);
      } else if (engine.Count(0.0) >= k) {
        threshold = engine.mean();
      }
    }
    OP_REQUIRES_OK(ctx, WriteSelection<T, Tidx>(ctx, x, engine.Collect(threshold, kNoUpper)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, {}, &out));
    out->scalar<double>()() = threshold;
  }

 private:
  bool allow_nan_;
};

// The attribute and input checks of the CPU and GPU kernels; Select does the rest.
template <typename T, typename Tidx>
class ThresholdSelectOpBase : public OpKernel {
 public:
  explicit ThresholdSelectOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("allow_nan", &allow_nan_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& xt = ctx->input(0);
    double threshold;
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 1, "threshold_select", "threshold", &threshold));
    const int64_t d = xt.NumElements();
    OP_REQUIRES_OK(ctx, CheckIndexType<Tidx>("threshold_select", d));
    Select(ctx, xt.flat<T>().data(), d, threshold);
  }

 protected:
  // Counts the NaN in x (unless allow_nan), calls CheckCounted, writes both outputs.
  virtual void Select(OpKernelContext* ctx, const T* x, int64_t d, double threshold) = 0;

  // NaN in x first: it is the usual cause of a NaN threshold (dgc_topk's sample).
  tensorflow::Status CheckCounted(int64_t n_nan, double threshold) const {
    TF_RETURN_IF_ERROR(CheckNan("threshold_select", n_nan, allow_nan_));
    if (std::isnan(threshold))
      return errors::InvalidArgument("threshold_select: threshold is NaN");
    return tensorflow::OkStatus();
  }

  bool allow_nan_;
};

template <typename T, typename Tidx>
class ThresholdSelectOp : public ThresholdSelectOpBase<T, Tidx> {
 public:
  using ThresholdSelectOpBase<T, Tidx>::ThresholdSelectOpBase;

 private:
  void Select(OpKernelContext* ctx, const T* x, int64_t d, double threshold) override {
    OP_REQUIRES_OK(ctx, this->CheckCounted(this->allow_nan_ ? 0 : CountNan(ctx, x, d), threshold));
    std::vector<int64_t> idx;
    for (const Entry& e : CollectRange(ctx, x, d, threshold, kNoUpper)) idx.push_back(e.index);
    OP_REQUIRES_OK(ctx, WriteSelection<T, Tidx>(ctx, x, idx));
  }
};

template <typename T>
class RatioCountsOp : public OpKernel {
 public:
  explicit RatioCountsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("allow_nan", &allow_nan_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& xt = ctx->input(0);
    const int64_t d = xt.NumElements();
    OP_REQUIRES_OK(ctx, CheckRatios(ctx->input(1), kMaxCounted));
    auto ratios = ctx->input(1).vec<double>();
    const T* x = xt.flat<T>().data();
    AbsStats st;  // an empty x: mean = max = 0, every count 0
    std::vector<int64_t> counts(ratios.size(), 0);
    if (d > 0) {
      st = ComputeAbsStats(ctx, x, d);
      OP_REQUIRES_OK(ctx, CheckNan("ratio_counts", st.n_nan, allow_nan_));
      std::vector<double> thresholds(ratios.size());
      for (int64_t j = 0; j < ratios.size(); ++j)
        thresholds[j] = Threshold(st.mean, st.max, ratios(j));
      counts = CountAndCollect(ctx, x, d, thresholds, std::numeric_limits<double>::infinity(),
                               nullptr);
    }
    Tensor *stats = nullptr, *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {2}, &stats));
    stats->vec<double>()(0) = st.mean;
    stats->vec<double>()(1) = st.max;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {ratios.size()}, &out));
    for (int64_t j = 0; j < ratios.size(); ++j)
      out->vec<int64_t>()(j) = counts[j];
  }

 private:
  bool allow_nan_;
};

#define REGISTER(T, Tidx)                                                                   \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("CommlibThresholdSearch").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T") \
          .TypeConstraint<Tidx>("Tidx"),                                                    \
      ThresholdSearchOp<T, Tidx>);                                                          \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("CommlibThresholdSelect").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T") \
          .TypeConstraint<Tidx>("Tidx"),                                                    \
      ThresholdSelectOp<T, Tidx>);
TFC_REGISTER_FLOAT_INDEX(REGISTER)
#undef REGISTER

#define REGISTER_COUNTS(T)                                                              \
  REGISTER_KERNEL_BUILDER(                                                              \
      Name("CommlibRatioCounts").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      RatioCountsOp<T>);
REGISTER_COUNTS(float)
REGISTER_COUNTS(Eigen::half)
REGISTER_COUNTS(Eigen::bfloat16)
#undef REGISTER_COUNTS

#if GOOGLE_CUDA
// x, values and indices on the GPU, threshold in host memory. One sync (pass 1 counts the output
// size and the NaN), then pass 2 writes in index order.
template <typename T, typename Tidx>
class ThresholdSelectGpuOp : public ThresholdSelectOpBase<T, Tidx> {
 public:
  using ThresholdSelectOpBase<T, Tidx>::ThresholdSelectOpBase;

 private:
  void Select(OpKernelContext* ctx, const T* x, int64_t d, double threshold) override {
    const auto& dev = ctx->eigen_device<Eigen::GpuDevice>();
    ThresholdSelectGpuFunctor<T, Tidx> select;
    Tensor workspace;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8, {select.WorkspaceBytes(d)},
                                           &workspace));
    int64_t n = 0, n_nan = 0;
    if (d > 0) {
      const std::string err = select.Count(dev, x, d, threshold,
                                           workspace.flat<int8_t>().data(), &n, &n_nan);
      OP_REQUIRES(ctx, err.empty(), errors::Internal(err));
    }
    OP_REQUIRES_OK(ctx, this->CheckCounted(n_nan, threshold));
    Tensor *values = nullptr, *indices = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {n}, &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {n}, &indices));
    if (n == 0) return;
    const std::string err = select.Write(dev, x, d, threshold, n, workspace.flat<int8_t>().data(),
                                         indices->flat<Tidx>().data(), values->flat<T>().data());
    OP_REQUIRES(ctx, err.empty(), errors::Internal(err));
  }
};

#define REGISTER_GPU(T, Tidx)                                                   \
  extern template struct ThresholdSelectGpuFunctor<T, Tidx>;                    \
  REGISTER_KERNEL_BUILDER(Name("CommlibThresholdSelect")                        \
                              .Device(tensorflow::DEVICE_GPU)                   \
                              .HostMemory("threshold")                          \
                              .TypeConstraint<T>("T")                           \
                              .TypeConstraint<Tidx>("Tidx"),                    \
                          ThresholdSelectGpuOp<T, Tidx>);
TFC_REGISTER_FLOAT_INDEX(REGISTER_GPU)
#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace tf_commlib
