// Kernels of CommlibMstopk: MSTopK (shi2021 Alg. 1). On the CPU the ProbeEngine answers it in 2-3
// passes; on the GPU (built with CUDA) MstopkGpuFunctor (mstopk_kernels.cu.cc), same results.
#define EIGEN_USE_THREADS
#include <random>

#include "tensorflow/core/framework/op_kernel.h"
#include "topk/mstopk.h"
#include "topk/probe_engine.h"
#include "topk/topk_common.h"
#if GOOGLE_CUDA
#include "topk/gpu_functors.h"
#endif

namespace tf_commlib {

// The attributes, input checks and empty case of the CPU and GPU kernels; Select does the rest.
template <typename T, typename Tidx>
class MstopkOpBase : public OpKernel {
 public:
  explicit MstopkOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
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
    int64_t seed;
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 2, "mstopk", "seed", &seed));
    if (seed < 0) seed = static_cast<int64_t>(std::random_device()() >> 1);
    if (d == 0) {  // nothing to select: thresholds and counts are all 0
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {0}, &out));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {0}, &out));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, {4}, &out));
      out->vec<double>().setZero();
      OP_REQUIRES_OK(ctx, ctx->allocate_output(3, {4}, &out));
      out->vec<int64_t>().setZero();
      return;
    }
    Select(ctx, xt.flat<T>().data(), d, k, static_cast<uint64_t>(seed));
  }

 protected:
  // Writes the four outputs for x of d > 0 entries.
  virtual void Select(OpKernelContext* ctx, const T* x, int64_t d, int64_t k, uint64_t seed) = 0;

  int num_samplings_;
  bool allow_nan_;
};

template <typename T, typename Tidx>
class MstopkOp : public MstopkOpBase<T, Tidx> {
 public:
  using MstopkOpBase<T, Tidx>::MstopkOpBase;

 private:
  void Select(OpKernelContext* ctx, const T* x, int64_t d, int64_t k, uint64_t seed) override {
    ProbeEngine<T> engine(ctx, x, d, std::min(k, d));
    const AbsStats& st = engine.stats();
    OP_REQUIRES_OK(ctx, CheckNan("mstopk", st.n_nan, this->allow_nan_));

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
      for (int i = 0; i < this->num_samplings_; ++i) {
        bool exact;
        const int64_t nnz = engine.CountAbove(s.NextRatio(), k, &exact);
        if (nnz > k) last_over_exact = exact;
        s.Observe(nnz);
      }
      if (!last_over_exact) {
        s = MstopkSearch(engine.mean(), engine.u(), k, d);
        for (int i = 0; i < this->num_samplings_; ++i) s.Observe(engine.Count(s.NextRatio()));
      }
      s.Finish(st.n_inf);
      start = s.BandStart(seed);
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
};

#define REGISTER(T, Tidx)                                                          \
  REGISTER_KERNEL_BUILDER(Name("CommlibMstopk")                                    \
                              .Device(tensorflow::DEVICE_CPU)                      \
                              .TypeConstraint<T>("T")                              \
                              .TypeConstraint<Tidx>("Tidx"),                       \
                          MstopkOp<T, Tidx>);
TFC_REGISTER_FLOAT_INDEX(REGISTER)
#undef REGISTER

#if GOOGLE_CUDA
// x, values and indices on the GPU; k, seed, thresholds and counts in host memory. The search
// runs on the host over counts made on the GPU.
template <typename T, typename Tidx>
class MstopkGpuOp : public MstopkOpBase<T, Tidx> {
 public:
  using MstopkOpBase<T, Tidx>::MstopkOpBase;

 private:
  void Select(OpKernelContext* ctx, const T* x, int64_t d, int64_t k, uint64_t seed) override {
    const int64_t n = std::min(k, d);
    Tensor *values = nullptr, *indices = nullptr, *thr = nullptr, *cnt = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {n}, &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {n}, &indices));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, {4}, &thr));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, {4}, &cnt));
    Tensor workspace;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8,
                                           {MstopkGpuFunctor<T, Tidx>::WorkspaceBytes(d)},
                                           &workspace));
    int64_t n_nan = 0;
    const std::string err = MstopkGpuFunctor<T, Tidx>()(
        ctx->eigen_device<Eigen::GpuDevice>(), x, d, k, this->num_samplings_, seed,
        this->allow_nan_, workspace.flat<int8_t>().data(), indices->flat<Tidx>().data(),
        values->flat<T>().data(), thr->vec<double>().data(), cnt->vec<int64_t>().data(), &n_nan);
    OP_REQUIRES(ctx, err.empty(), errors::Internal(err));
    OP_REQUIRES_OK(ctx, CheckNan("mstopk", n_nan, this->allow_nan_));
  }
};

#define REGISTER_GPU(T, Tidx)                                                      \
  extern template struct MstopkGpuFunctor<T, Tidx>;                                \
  REGISTER_KERNEL_BUILDER(Name("CommlibMstopk")                                    \
                              .Device(tensorflow::DEVICE_GPU)                      \
                              .HostMemory("k")                                     \
                              .HostMemory("seed")                                  \
                              .HostMemory("thresholds")                            \
                              .HostMemory("counts")                                \
                              .TypeConstraint<T>("T")                              \
                              .TypeConstraint<Tidx>("Tidx"),                       \
                          MstopkGpuOp<T, Tidx>);
TFC_REGISTER_FLOAT_INDEX(REGISTER_GPU)
#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace tf_commlib
