// CPU kernel of CommlibMstopk: MSTopK (shi2021 Alg. 1) answered by the ProbeEngine in 2-3 passes.
#define EIGEN_USE_THREADS
#include <random>

#include "tensorflow/core/framework/op_kernel.h"
#include "topk/mstopk.h"
#include "topk/probe_engine.h"
#include "topk/topk_common.h"

namespace tf_commlib {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
namespace errors = tensorflow::errors;

template <typename T, typename Tidx>
class MstopkOp : public OpKernel {
 public:
  explicit MstopkOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_samplings", &num_samplings_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("allow_nan", &allow_nan_));
    OP_REQUIRES(ctx, num_samplings_ >= 1 && num_samplings_ <= kMaxSamplings,
                errors::InvalidArgument("mstopk: num_samplings must be in [1, ", kMaxSamplings,
                                        "], got ", num_samplings_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& xt = ctx->input(0);
    int64_t k;
    OP_REQUIRES_OK(ctx, ReadK(ctx, "mstopk", xt, &k));
    const int64_t d = xt.NumElements();
    OP_REQUIRES_OK(ctx, CheckIndexType<Tidx>("mstopk", d));
    const T* x = xt.flat<T>().data();
    int64_t seed;
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 2, "mstopk", "seed", &seed));
    if (seed < 0) seed = static_cast<int64_t>(std::random_device()() >> 1);
    if (d == 0) {  // nothing to select: thresholds and counts are all 0
      OP_REQUIRES_OK(ctx, WriteSelection<T, Tidx>(ctx, x, {}));
      Tensor *thr = nullptr, *cnt = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, {4}, &thr));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(3, {4}, &cnt));
      thr->vec<double>().setZero();
      cnt->vec<int64_t>().setZero();
      return;
    }

    ProbeEngine<T> engine(ctx, x, d, std::min(k, d));
    const AbsStats& st = engine.stats();
    OP_REQUIRES_OK(ctx, CheckNan("mstopk", st.n_nan, allow_nan_));

    std::vector<int64_t> idx;
    double thres1 = 0, thres2 = 0;
    int64_t k1 = 0, k2 = 0, start = 0;
    const double inf = std::numeric_limits<double>::infinity();
    if (k >= d) {  // everything, in index order
      idx.resize(d);
      for (int64_t i = 0; i < d; ++i) idx[i] = i;
      k1 = k2 = d;
    } else if (st.n_inf >= k) {  // the first k infinite entries
      idx = engine.Collect(inf, kNoUpper);
      idx.resize(k);
      thres1 = thres2 = inf;
      k1 = k;
      k2 = st.n_inf;
    } else {
      // Probes below the collected entries only need to be known as "> k" (their count, d here,
      // never lowers k2) unless the last "> k" probe is one of them: then search again exactly.
      MstopkSearch s(engine.mean(), engine.u(), k, d);
      bool last_over_exact = true;
      for (int i = 0; i < num_samplings_; ++i) {
        bool exact;
        const int64_t nnz = engine.CountAbove(s.NextRatio(), k, &exact);
        if (nnz > k) last_over_exact = exact;
        s.Observe(nnz);
      }
      if (!last_over_exact) {
        s = MstopkSearch(engine.mean(), engine.u(), k, d);
        for (int i = 0; i < num_samplings_; ++i) s.Observe(engine.Count(s.NextRatio()));
      }
      s.Finish(st.n_inf);
      start = s.BandStart(static_cast<uint64_t>(seed));
      idx = engine.Collect(s.thres1, kNoUpper);
      std::vector<int64_t> band = engine.Collect(s.thres2, s.thres1);
      idx.insert(idx.end(), band.begin() + start, band.begin() + start + (k - s.k1));
      thres1 = s.thres1;
      thres2 = s.thres2;
      k1 = s.k1;
      k2 = s.k2;
    }
    OP_REQUIRES_OK(ctx, WriteSelection<T, Tidx>(ctx, x, idx));
    Tensor* thr = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, {4}, &thr));
    auto tv = thr->vec<double>();
    tv(0) = thres1; tv(1) = thres2; tv(2) = engine.mean(); tv(3) = engine.u();
    Tensor* cnt = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, {4}, &cnt));
    auto cv = cnt->vec<int64_t>();
    cv(0) = k1; cv(1) = k2; cv(2) = start; cv(3) = st.n_inf;
  }

 private:
  int num_samplings_;
  bool allow_nan_;
};

#define REGISTER(T, Tidx)                                                          \
  REGISTER_KERNEL_BUILDER(Name("CommlibMstopk")                                    \
                              .Device(tensorflow::DEVICE_CPU)                      \
                              .TypeConstraint<T>("T")                              \
                              .TypeConstraint<Tidx>("Tidx"),                       \
                          MstopkOp<T, Tidx>);
TFC_REGISTER_FLOAT_INDEX(REGISTER)
#undef REGISTER

}  // namespace tf_commlib
