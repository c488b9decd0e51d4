// Exact answers to the probes count(a >= thres(ratio)) of a binary search over dyadic ratios,
// in few passes (NOTES.md: every probe is a dyadic point of [mean, u]):
//  * one histogram pass with 2^kHistBits buckets bounded by the exact probe thresholds answers
//    every probe of the first kHistBits levels;
//  * deeper probes lie inside one bucket; the entries at or above that bucket's lower threshold
//    (a few more than k) are collected once and answer the rest from a sorted copy.
// The collection is fused into the histogram pass when a sample (taken in the statistics pass)
// predicts a low enough threshold; otherwise it costs one more pass.
#ifndef TF_COMMLIB_OPS_TOPK_PROBE_ENGINE_H_
#define TF_COMMLIB_OPS_TOPK_PROBE_ENGINE_H_

#include <algorithm>
#include <functional>
#include <vector>

#include "topk/abs_passes.h"

namespace tf_commlib {

template <typename T>
class ProbeEngine {
 public:
  static constexpr int kHistBits = 12;
  static constexpr int64_t kBuckets = int64_t{1} << kHistBits;

  // expected: about how many entries the caller will end up selecting (sizes the fused collection).
  ProbeEngine(tensorflow::OpKernelContext* ctx, const T* x, int64_t d, int64_t expected)
      : ctx_(ctx), x_(x), d_(d) {
    const int64_t stride = std::max<int64_t>(1, d / 65536);
    std::vector<float> sample;
    stats_ = ComputeAbsStats(ctx, x, d, stride, &sample);
    mean_ = stats_.mean;
    u_ = stats_.max;
    // Sample guess of a threshold that about 4x `expected` entries pass.
    const int64_t want = 4 * expected * static_cast<int64_t>(sample.size()) / std::max<int64_t>(d, 1) + 8;
    double guess = std::numeric_limits<double>::infinity();
    if (want < static_cast<int64_t>(sample.size())) {
      std::nth_element(sample.begin(), sample.begin() + want, sample.end(), std::greater<float>());
      guess = sample[want];
    }
    if (!(guess > mean_)) guess = std::numeric_limits<double>::infinity();  // would collect too much
    Histogram(guess);
  }

  const AbsStats& stats() const { return stats_; }
  double mean() const { return mean_; }
  double u() const { return u_; }

  // count(a >= thres(ratio)) for a dyadic ratio in (0, 1) with at most kMaxSamplings bits.
  int64_t Count(double ratio) {
    if (!(u_ > mean_)) return top_;  // every entry equals the mean (or is infinite)
    const double scaled = ratio * kBuckets;
    const int64_t j = static_cast<int64_t>(scaled);
    if (static_cast<double>(j) == scaled) return suffix_[j];
    EnsureCandidates(edges_[j]);
    const double t = Threshold(mean_, u_, ratio);
    // cand_a_ is sorted descending: count the entries >= t.
    return std::upper_bound(cand_a_.begin(), cand_a_.end(), t, std::greater<double>()) -
           cand_a_.begin();
  }

  // Indices, in index order, of the entries with lo <= a < hi (hi = kNoUpper: no bound).
  std::vector<int64_t> Collect(double lo, double hi) {
    if (lo >= cand_lo_) {
      std::vector<int64_t> out;
      for (int64_t i : cand_) {
        const double a = AbsOf(x_[i]);
        if (a >= lo && !(a >= hi)) out.push_back(i);
      }
      return out;
    }
    return CollectRange(ctx_, x_, d_, lo, hi);
  }

 private:
  void Histogram(double guess) {
    edges_.resize(kBuckets + 1);
    for (int64_t j = 0; j <= kBuckets; ++j)
      edges_[j] = Threshold(mean_, u_, static_cast<double>(j) / kBuckets);
    const bool flat = !(u_ > mean_);
    const double lo = edges_[0], hi = edges_[kBuckets];
    const double scale = flat ? 0.0 : kBuckets / (u_ - mean_);
    const int64_t blocks = NumBlocks(d_);
    std::vector<std::vector<int64_t>> hist(blocks), cand(blocks);
    ForEachBlock(ctx_, d_, blocks, [&](int64_t b, int64_t i0, int64_t i1) {
      std::vector<int64_t>& h = hist[b];
      h.assign(kBuckets + 1, 0);  // h[kBuckets] counts a >= thres(1)
      for (int64_t i = i0; i < i1; ++i) {
        const double a = AbsOf(x_[i]);
        if (a < lo) continue;
        if (a >= guess) cand[b].push_back(i);
        if (flat || a >= hi) { h[kBuckets]++; continue; }
        int64_t j = std::min<int64_t>(kBuckets - 1, static_cast<int64_t>((a - mean_) * scale));
        while (j + 1 < kBuckets && a >= edges_[j + 1]) ++j;
        while (j > 0 && a < edges_[j]) --j;
        h[j]++;
      }
    });
    suffix_.assign(kBuckets + 1, 0);
    for (const auto& h : hist)
      for (int64_t j = 0; j <= kBuckets; ++j) suffix_[j] += h[j];
    top_ = suffix_[kBuckets];
    for (int64_t j = kBuckets - 1; j >= 0; --j) suffix_[j] += suffix_[j + 1];
    for (auto& c : cand) cand_.insert(cand_.end(), c.begin(), c.end());
    cand_lo_ = guess;
    SortCandidates();
  }

  void EnsureCandidates(double lo) {
    if (lo >= cand_lo_) return;
    cand_ = CollectRange(ctx_, x_, d_, lo, kNoUpper);
    cand_lo_ = lo;
    SortCandidates();
  }

  void SortCandidates() {
    cand_a_.clear();
    for (int64_t i : cand_) cand_a_.push_back(AbsOf(x_[i]));
    std::sort(cand_a_.begin(), cand_a_.end(), std::greater<double>());
  }

  tensorflow::OpKernelContext* ctx_;
  const T* x_;
  int64_t d_;
  AbsStats stats_;
  double mean_ = 0, u_ = 0;
  std::vector<double> edges_;
  std::vector<int64_t> suffix_;
  int64_t top_ = 0;
  std::vector<int64_t> cand_;     // every index with a >= cand_lo_, in index order
  double cand_lo_ = std::numeric_limits<double>::infinity();
  std::vector<double> cand_a_;    // their a, descending
};

}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_TOPK_PROBE_ENGINE_H_
