// CPU kernels of CommlibThresholdSearch, CommlibThresholdSelect and CommlibRatioCounts.
#define EIGEN_USE_THREADS
#include "tensorflow/core/framework/op_kernel.h"
#include "topk/probe_engine.h"
#include "topk/topk_common.h"

namespace tf_commlib {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
namespace errors = tensorflow::errors;

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

template <typename T, typename Tidx>
class ThresholdSelectOp : public OpKernel {
 public:
  explicit ThresholdSelectOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("allow_nan", &allow_nan_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& xt = ctx->input(0);
    double threshold;
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 1, "threshold_select", "threshold", &threshold));
    const int64_t d = xt.NumElements();
    OP_REQUIRES_OK(ctx, CheckIndexType<Tidx>("threshold_select", d));
    const T* x = xt.flat<T>().data();
    if (!allow_nan_) {   // first: a NaN in x is the usual cause of a NaN threshold (dgc_topk's sample)
      const int64_t n_nan = CountNan(ctx, x, d);
      OP_REQUIRES_OK(ctx, CheckNan("threshold_select", n_nan, false));
    }
    OP_REQUIRES(ctx, !std::isnan(threshold),
                errors::InvalidArgument("threshold_select: threshold is NaN"));
    std::vector<int64_t> idx;
    for (const Entry& e : CollectRange(ctx, x, d, threshold, kNoUpper)) idx.push_back(e.index);
    OP_REQUIRES_OK(ctx, WriteSelection<T, Tidx>(ctx, x, idx));
  }

 private:
  bool allow_nan_;
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

}  // namespace tf_commlib
