// CPU passes over a = |x| shared by the top-k kernels: statistics, histogram of probe thresholds,
// counting and collection. Every pass cuts x into the fixed blocks of common/parallel.h.
#ifndef TF_COMMLIB_OPS_TOPK_ABS_PASSES_H_
#define TF_COMMLIB_OPS_TOPK_ABS_PASSES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/parallel.h"
#include "topk/mstopk.h"

namespace tf_commlib {

// |x| as float with NaN read as 0 (callers reject NaN first unless it is allowed).
template <typename T>
inline float AbsOf(T v) {
  const float a = std::fabs(static_cast<float>(v));
  return a == a ? a : 0.0f;
}

struct AbsStats {
  double sum = 0.0;   // finite entries, in the order defined in mstopk.h
  float max = 0.0f;   // largest finite entry
  int64_t n_nan = 0, n_inf = 0;
  double mean = 0.0;
};

// Pass 1: sum (fixed order), max, NaN and Inf counts; also copies every `stride`-th a into sample.
template <typename T>
AbsStats ComputeAbsStats(tensorflow::OpKernelContext* ctx, const T* x, int64_t d, int64_t stride,
                         std::vector<float>* sample) {
  const int64_t chunks = (d + kChunk - 1) / kChunk;
  const int64_t blocks = std::min<int64_t>(chunks, NumBlocks(d));
  std::vector<double> chunk_sum(chunks);
  std::vector<AbsStats> part(blocks);
  std::vector<std::vector<float>> samples(blocks);
  ForEachBlock(ctx, chunks, blocks, [&](int64_t b, int64_t c0, int64_t c1) {
    AbsStats s;
    float mx = 0.0f;
    for (int64_t c = c0; c < c1; ++c) {
      double lane[kLanes] = {0};
      const int64_t base = c * kChunk, end = std::min(d, base + kChunk);
      if (end - base == kChunk) {
        for (int64_t t = 0; t < kChunk; t += kLanes) {
          for (int64_t j = 0; j < kLanes; ++j) {
            const float a = std::fabs(static_cast<float>(x[base + t + j]));
            const bool fin = a <= std::numeric_limits<float>::max();  // false for NaN and Inf
            lane[j] += fin ? static_cast<double>(a) : 0.0;
            mx = fin && a > mx ? a : mx;
          }
        }
      } else {
        for (int64_t i = base; i < end; ++i) {
          const float a = std::fabs(static_cast<float>(x[i]));
          const bool fin = a <= std::numeric_limits<float>::max();
          lane[(i - base) % kLanes] += fin ? static_cast<double>(a) : 0.0;
          mx = fin && a > mx ? a : mx;
        }
      }
      double cs = 0.0;
      for (int64_t j = 0; j < kLanes; ++j) cs += lane[j];
      chunk_sum[c] = cs;
      for (int64_t i = base; i < end; ++i) {  // rare-path counts, vectorizable compare
        const float v = static_cast<float>(x[i]);
        s.n_nan += v != v;
        s.n_inf += std::isinf(v);
      }
      if (sample) {
        for (int64_t i = (base + stride - 1) / stride * stride; i < end; i += stride)
          samples[b].push_back(AbsOf(x[i]));
      }
    }
    s.max = mx;
    part[b] = s;
  });
  AbsStats out;
  for (int64_t c = 0; c < chunks; ++c) out.sum += chunk_sum[c];
  for (const auto& s : part) {
    out.max = std::max(out.max, s.max);
    out.n_nan += s.n_nan;
    out.n_inf += s.n_inf;
  }
  out.mean = d > out.n_inf ? out.sum / static_cast<double>(d - out.n_inf) : 0.0;
  if (sample)
    for (auto& v : samples) sample->insert(sample->end(), v.begin(), v.end());
  return out;
}

// hi for "no upper bound": every comparison with NaN is false, so !(a >= kNoUpper) always holds.
constexpr double kNoUpper = std::numeric_limits<double>::quiet_NaN();

// Indices (in index order) of the entries with lo <= a and !(a >= hi).
template <typename T>
std::vector<int64_t> CollectRange(tensorflow::OpKernelContext* ctx, const T* x, int64_t d,
                                  double lo, double hi) {
  const int64_t blocks = NumBlocks(d);
  std::vector<std::vector<int64_t>> part(blocks);
  ForEachBlock(ctx, d, blocks, [&](int64_t b, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const double a = AbsOf(x[i]);
      if (a >= lo && !(a >= hi)) part[b].push_back(i);
    }
  });
  std::vector<int64_t> out;
  for (auto& p : part) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// count(a >= t) for each threshold t, in one pass. thresholds must be sorted ascending.
template <typename T>
std::vector<int64_t> CountAbove(tensorflow::OpKernelContext* ctx, const T* x, int64_t d,
                                const std::vector<double>& thresholds) {
  const int64_t blocks = NumBlocks(d), m = thresholds.size();
  std::vector<std::vector<int64_t>> part(blocks, std::vector<int64_t>(m + 1, 0));
  ForEachBlock(ctx, d, blocks, [&](int64_t b, int64_t i0, int64_t i1) {
    auto& h = part[b];
    for (int64_t i = i0; i < i1; ++i) {
      const double a = AbsOf(x[i]);
      // number of thresholds <= a
      h[std::upper_bound(thresholds.begin(), thresholds.end(), a) - thresholds.begin()]++;
    }
  });
  std::vector<int64_t> counts(m, 0);
  for (const auto& h : part) {
    int64_t run = 0;
    for (int64_t j = m; j >= 1; --j) { run += h[j]; counts[j - 1] += run; }
  }
  return counts;
}

}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_TOPK_ABS_PASSES_H_
