// CPU passes over a = |x| shared by the top-k kernels: statistics, threshold counts and
// collection. Every pass cuts x into the fixed blocks of common/parallel.h and is written as
// plain loops that the compiler vectorizes (no data-dependent branches in the hot loops).
//
// All comparisons of a probe threshold t (float64) with a (float32) are done in float32 against
// CeilToFloat(t), the smallest float >= t: for every float a, a >= t  <=>  a >= CeilToFloat(t).
#ifndef TF_COMMLIB_OPS_TOPK_ABS_PASSES_H_
#define TF_COMMLIB_OPS_TOPK_ABS_PASSES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common/parallel.h"
#include "topk/mstopk.h"

namespace tf_commlib {

// |x| as float with NaN read as 0 (callers reject NaN first unless it is allowed).
template <typename T>
inline float AbsOf(T v) {
  const float a = std::fabs(static_cast<float>(v));
  return a == a ? a : 0.0f;
}

inline float CeilToFloat(double t) {
  if (std::isnan(t)) return std::numeric_limits<float>::quiet_NaN();
  float f = static_cast<float>(t);
  if (static_cast<double>(f) < t) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}

// hi for "no upper bound": every comparison with NaN is false, so !(a >= kNoUpper) always holds.
constexpr double kNoUpper = std::numeric_limits<double>::quiet_NaN();

// An entry of x: its index and a = |x|.
struct Entry {
  int64_t index;
  float a;
};

struct AbsStats {
  double sum = 0.0;  // finite entries, in the order defined in mstopk.h
  float max = 0.0f;  // largest finite entry
  float max_below = 0.0f;  // largest entry under the collection threshold (0 if none)
  int64_t n_nan = 0, n_inf = 0;
  double mean = 0.0;
};

// Appends the entries of x[begin, end) with a >= lo to out.
template <typename T>
inline void AppendAbove(const T* x, int64_t begin, int64_t end, float lo, std::vector<Entry>* out) {
  int64_t i = begin;
#if defined(__AVX2__)
  if (std::is_same<T, float>::value && lo > 0) {
    const __m256 vlo = _mm256_set1_ps(lo);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= end; i += 8) {
      const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(reinterpret_cast<const float*>(x) + i));
      int mask = _mm256_movemask_ps(_mm256_cmp_ps(a, vlo, _CMP_GE_OQ));
      while (mask) {
        const int j = __builtin_ctz(mask);
        out->push_back({i + j, std::fabs(static_cast<float>(x[i + j]))});
        mask &= mask - 1;
      }
    }
  }
#endif
  for (; i < end; ++i) {
    const float a = AbsOf(x[i]);
    if (a >= lo) out->push_back({i, a});
  }
}

// Statistics of one chunk, the careful way (NaN and Inf present): lane sums of the finite a,
// their max, the NaN and Inf counts, and the entries with a >= lo.
template <typename T>
inline double CarefulChunk(const T* x, int64_t base, int64_t end, float lo, bool collect,
                           AbsStats* st, std::vector<Entry>* out) {
  double lane[kLanes] = {0};
  for (int64_t i = base; i < end; ++i) {
    const float v = static_cast<float>(x[i]);
    const float a = std::fabs(v);
    st->n_nan += v != v;
    st->n_inf += std::isinf(v);
    if (a <= std::numeric_limits<float>::max()) {
      lane[(i - base) % kLanes] += static_cast<double>(a);
      st->max = std::max(st->max, a);
    }
    if (collect && AbsOf(x[i]) >= lo) out->push_back({i, AbsOf(x[i])});
    if (AbsOf(x[i]) < lo) st->max_below = std::max(st->max_below, AbsOf(x[i]));
  }
  double cs = 0.0;
  for (int64_t j = 0; j < kLanes; ++j) cs += lane[j];
  return cs;
}

// Pass 1: sum (fixed order), max, NaN and Inf counts; also collects the entries with
// a >= collect_lo (index order) when `collected` is given.
// The hot loop ignores NaN and Inf; a chunk whose sum comes out non-finite is redone carefully.
template <typename T>
AbsStats ComputeAbsStats(tensorflow::OpKernelContext* ctx, const T* x, int64_t d,
                         double collect_lo = kNoUpper,
                         std::vector<Entry>* collected = nullptr) {
  const float clo = CeilToFloat(collect_lo);
  const bool collect = collected != nullptr && !std::isnan(clo);
  const float probe = collect ? clo : std::numeric_limits<float>::infinity();
  const int64_t chunks = (d + kChunk - 1) / kChunk;
  const int64_t blocks = std::min<int64_t>(chunks, NumBlocks(d));
  std::vector<double> chunk_sum(chunks);
  std::vector<AbsStats> part(blocks);
  std::vector<std::vector<Entry>> entries(blocks);
  ForEachBlock(ctx, chunks, blocks, [&](int64_t b, int64_t c0, int64_t c1) {
    AbsStats& st = part[b];
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t base = c * kChunk, end = std::min(d, base + kChunk);
      double lane[kLanes] = {0};
      float mx[kLanes] = {0}, below[kLanes] = {0};
      int32_t above[kLanes] = {0};
      const int64_t full = base + (end - base) / kLanes * kLanes;
      for (int64_t t = base; t < full; t += kLanes) {
        for (int64_t j = 0; j < kLanes; ++j) {
          const float a = std::fabs(static_cast<float>(x[t + j]));
          lane[j] += static_cast<double>(a);
          mx[j] = std::max(mx[j], a);
          above[j] += a >= probe;
          below[j] = std::max(below[j], a < probe ? a : 0.0f);
        }
      }
      for (int64_t i = full; i < end; ++i) {
        const float a = std::fabs(static_cast<float>(x[i]));
        lane[i - full] += static_cast<double>(a);
        mx[0] = std::max(mx[0], a);
        above[0] += a >= probe;
        below[0] = std::max(below[0], a < probe ? a : 0.0f);
      }
      double cs = 0.0;
      int32_t n_above = 0;
      for (int64_t j = 0; j < kLanes; ++j) cs += lane[j], n_above += above[j];
      const float cmx = *std::max_element(mx, mx + kLanes);
      if (std::isfinite(cs) && std::isfinite(cmx)) {
        chunk_sum[c] = cs;
        st.max = std::max(st.max, cmx);
        st.max_below = std::max(st.max_below, *std::max_element(below, below + kLanes));
        if (collect && n_above > 0) AppendAbove(x, base, end, clo, &entries[b]);
      } else {
        chunk_sum[c] = CarefulChunk(x, base, end, clo, collect, &st, &entries[b]);
      }
    }
  });
  AbsStats out;
  for (int64_t c = 0; c < chunks; ++c) out.sum += chunk_sum[c];
  for (const AbsStats& st : part) {
    out.max = std::max(out.max, st.max);
    out.max_below = std::max(out.max_below, st.max_below);
    out.n_nan += st.n_nan;
    out.n_inf += st.n_inf;
  }
  out.mean = d > out.n_inf ? out.sum / static_cast<double>(d - out.n_inf) : 0.0;
  if (collect)
    for (auto& p : entries) collected->insert(collected->end(), p.begin(), p.end());
  return out;
}

// The number of NaN in x.
template <typename T>
int64_t CountNan(tensorflow::OpKernelContext* ctx, const T* x, int64_t d) {
  const int64_t blocks = NumBlocks(d);
  std::vector<int64_t> part(blocks, 0);
  ForEachBlock(ctx, d, blocks, [&](int64_t b, int64_t i0, int64_t i1) {
    int64_t n = 0;
    for (int64_t i = i0; i < i1; ++i) n += static_cast<float>(x[i]) != static_cast<float>(x[i]);
    part[b] = n;
  });
  int64_t n = 0;
  for (int64_t p : part) n += p;
  return n;
}

// The entries (in index order) with lo <= a and !(a >= hi).
template <typename T>
std::vector<Entry> CollectRange(tensorflow::OpKernelContext* ctx, const T* x, int64_t d,
                                  double lo, double hi) {
  const float lo_f = CeilToFloat(lo), hi_f = CeilToFloat(hi);
  const int64_t blocks = NumBlocks(d);
  std::vector<std::vector<Entry>> part(blocks);
  ForEachBlock(ctx, d, blocks, [&](int64_t b, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float a = AbsOf(x[i]);
      if (a >= lo_f && !(a >= hi_f)) part[b].push_back({i, a});
    }
  });
  std::vector<Entry> out;
  for (auto& p : part) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// One pass: counts[j] = count(a >= thresholds[j]) for up to kMaxCounted thresholds, and the
// entries (index order) with a >= collect_lo (collect_lo = +inf: the infinite ones).
constexpr int kMaxCounted = 9;
template <typename T>
std::vector<int64_t> CountAndCollect(tensorflow::OpKernelContext* ctx, const T* x, int64_t d,
                                     const std::vector<double>& thresholds, double collect_lo,
                                     std::vector<Entry>* collected) {
  float f[kMaxCounted + 1];
  const int m = thresholds.size();
  for (int j = 0; j <= kMaxCounted; ++j)
    f[j] = j < m ? CeilToFloat(thresholds[j]) : std::numeric_limits<float>::infinity();
  f[kMaxCounted] = CeilToFloat(collect_lo);
  const int64_t blocks = NumBlocks(d);
  std::vector<std::vector<int64_t>> counts(blocks, std::vector<int64_t>(kMaxCounted, 0));
  std::vector<std::vector<Entry>> part(blocks);
  ForEachBlock(ctx, d, blocks, [&](int64_t b, int64_t i0, int64_t i1) {
    constexpr int64_t kSub = 2048;
    float buf[kSub];
    for (int64_t s = i0; s < i1; s += kSub) {
      const int64_t n = std::min(i1 - s, kSub);
      for (int64_t i = 0; i < n; ++i) buf[i] = AbsOf(x[s + i]);
      int32_t c[kMaxCounted + 1];
      for (int j = 0; j <= kMaxCounted; ++j) {  // one vectorized reduction per threshold
        const float fj = f[j];
        int32_t cj = 0;
        for (int64_t i = 0; i < n; ++i) cj += buf[i] >= fj;
        c[j] = cj;
      }
      for (int j = 0; j < kMaxCounted; ++j) counts[b][j] += c[j];
      if (c[kMaxCounted] > 0) AppendAbove(x, s, s + n, f[kMaxCounted], &part[b]);
    }
  });
  std::vector<int64_t> total(m, 0);
  for (const auto& c : counts)
    for (int j = 0; j < m; ++j) total[j] += c[j];
  if (collected)
    for (auto& p : part) collected->insert(collected->end(), p.begin(), p.end());
  return total;
}

}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_TOPK_ABS_PASSES_H_
