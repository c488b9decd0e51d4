// Exact answers to the probes count(a >= thres(ratio)) of a binary search over dyadic ratios
// (MSTopK, RedSync's threshold search), in as few passes over x as possible. NOTES.md: every
// probe is a dyadic point of [mean, u], so few passes can answer many probes.
//
//  * Pass 1 computes mean and max and, using a strided pre-sample of x, collects every entry
//    above a threshold that about 4x the expected number of entries pass.
//  * A probe whose threshold is at or above the collection threshold is answered from the
//    collected entries: they are bucketed at 2^kRefineBits exact probe thresholds, and the bucket
//    of the search path again, and so on (a chain of nested intervals).
//  * A probe below it (a dense selection, or a misleading pre-sample) costs one more pass: exact
//    counts at the 9 thresholds that split the search's current interval in 8, fused with
//    collecting the entries above the split point that a larger strided sample predicts.
#ifndef TF_COMMLIB_OPS_TOPK_PROBE_ENGINE_H_
#define TF_COMMLIB_OPS_TOPK_PROBE_ENGINE_H_

#include <algorithm>
#include <functional>
#include <map>
#include <vector>

#include "topk/abs_passes.h"

namespace tf_commlib {

template <typename T>
class ProbeEngine {
 public:
  static constexpr int kSplitBits = 3;  // levels counted by a fallback pass
  static constexpr int kRefineBits = 8;
  static constexpr int64_t kRefine = int64_t{1} << kRefineBits;

  // expected: about how many entries the caller will end up selecting.
  ProbeEngine(tensorflow::OpKernelContext* ctx, const T* x, int64_t d, int64_t expected)
      : ctx_(ctx), x_(x), d_(d), expected_(expected) {
    std::vector<float> pre;  // strided pre-sample, 4096 reads
    const int64_t pre_n = std::min<int64_t>(d, 4096);
    for (int64_t s = 0; s < pre_n; ++s) pre.push_back(AbsOf(x[s * d / pre_n]));
    const double lo = Predict(&pre, 4 * expected_, 16);
    stats_ = ComputeAbsStats(ctx, x, d, lo, &cand_);
    cand_lo_ = std::isinf(lo) ? kNoUpper : lo;  // an infinite lo collected nothing useful
    if (std::isnan(cand_lo_)) cand_.clear();
    mean_ = stats_.mean;
    u_ = stats_.max;
  }

  const AbsStats& stats() const { return stats_; }
  double mean() const { return mean_; }
  double u() const { return u_; }

  // count(a >= thres(ratio)) for a dyadic ratio in [0, 1) with at most kMaxSamplings bits,
  // asked as the midpoint of the binary search's current interval.
  int64_t Count(double ratio) {
    const auto hit = counted_.find(ratio);
    if (hit != counted_.end()) return hit->second;
    const double t = Threshold(mean_, u_, ratio);
    if (!(t >= cand_lo_)) Split(ratio);
    if (counted_.count(ratio)) return counted_[ratio];
    if (chain_.empty()) {
      Interval root{0.0, 0, {}, 0, {}, {}};
      for (const Entry& e : cand_) root.vals.push_back(e.a);
      Bucket(&root);
      chain_.push_back(std::move(root));
    }
    for (size_t depth = 0;; ++depth) {
      const Interval& in = chain_[depth];
      const double p = std::ldexp(ratio - in.rl, in.level + kRefineBits);
      const int64_t q = static_cast<int64_t>(p);
      if (static_cast<double>(q) == p) return in.above + in.suffix[q];
      const double child_rl = in.rl + std::ldexp(static_cast<double>(q), -(in.level + kRefineBits));
      if (depth + 1 < chain_.size() && chain_[depth + 1].rl == child_rl) continue;
      chain_.resize(depth + 1);
      Interval child{child_rl, in.level + kRefineBits, {}, in.above + in.suffix[q + 1], {}, {}};
      const float lo = in.edges[q], hi = in.edges[q + 1];
      for (float a : in.vals)
        if (a >= lo && a < hi) child.vals.push_back(a);
      Bucket(&child);
      chain_.push_back(std::move(child));
    }
  }

  // count(a >= thres(ratio)), or d with *exact = false when the count is known to exceed
  // `floor` (so the probe's direction is known) but only another pass could tell it exactly.
  int64_t CountAbove(double ratio, int64_t floor, bool* exact) {
    *exact = true;
    const double t = Threshold(mean_, u_, ratio);
    if (!counted_.count(ratio) && !(t >= cand_lo_) && static_cast<int64_t>(cand_.size()) > floor &&
        !std::isnan(cand_lo_)) {
      if (stats_.max_below < t) return cand_.size();  // nothing between t and the collected ones
      *exact = false;
      return d_;
    }
    return Count(ratio);
  }

  // Indices, in index order, of the entries with lo <= a < hi (hi = kNoUpper: no bound).
  std::vector<int64_t> Collect(double lo, double hi) {
    std::vector<int64_t> out;
    const bool covered = lo >= cand_lo_ || (!std::isnan(cand_lo_) && stats_.max_below < lo);
    if (!covered) {
      for (const Entry& e : CollectRange(ctx_, x_, d_, lo, hi)) out.push_back(e.index);
      return out;
    }
    const float lo_f = CeilToFloat(lo), hi_f = CeilToFloat(hi);
    for (const Entry& e : cand_)
      if (e.a >= lo_f && !(e.a >= hi_f)) out.push_back(e.index);
    return out;
  }

 private:
  struct Interval {
    double rl;                    // ratio of its lower end; its width is 2^-level
    int level;
    std::vector<float> vals;      // a of the collected entries inside it
    int64_t above;                // entries at or above its upper end
    std::vector<int64_t> suffix;  // suffix[s]: vals >= edges[s]
    std::vector<float> edges;     // CeilToFloat of the kRefine + 1 sub-thresholds
  };

  // The a that about `want` of d entries reach, judged from a sample (+inf: too few to judge;
  // the mean is never predicted, so a dense selection does not collect half of x).
  double Predict(std::vector<float>* sample, int64_t want, int64_t min_hits) {
    const int64_t n = sample->size();
    const int64_t hits = std::max(min_hits, want * n / std::max<int64_t>(d_, 1) + 8);
    if (hits >= n / 4) return std::numeric_limits<double>::infinity();
    std::nth_element(sample->begin(), sample->begin() + hits, sample->end(), std::greater<float>());
    const float v = (*sample)[hits];
    return v > 0 ? v : std::numeric_limits<double>::infinity();
  }

  // One pass for a probe below the collected range: exact counts at the 9 thresholds that cut
  // the search's current interval (the probe's parent) in 8, and the entries above the cut the
  // full sample predicts for 1.5x the expected selection.
  void Split(double ratio) {
    int level = 0;
    while (std::ldexp(ratio, level) != std::floor(std::ldexp(ratio, level))) ++level;
    const double l = ratio - std::ldexp(1.0, -level), w = std::ldexp(1.0, -(level - 1 + kSplitBits));
    std::vector<double> ratios, t;
    for (int j = 0; j <= (1 << kSplitBits); ++j) {
      ratios.push_back(l + w * j);
      t.push_back(Threshold(mean_, u_, ratios.back()));
    }
    std::vector<float> sample;  // strided sample, 16384 reads
    const int64_t n = std::min<int64_t>(d_, 16384);
    for (int64_t i = 0; i < n; ++i) sample.push_back(AbsOf(x_[i * d_ / n]));
    const double predicted = Predict(&sample, 3 * expected_ / 2, 8);
    double collect = t[0];
    for (int j = (1 << kSplitBits) - 1; j >= 1; --j)
      if (t[j] <= predicted) { collect = t[j]; break; }
    cand_.clear();
    const std::vector<int64_t> counts = CountAndCollect(ctx_, x_, d_, t, collect, &cand_);
    for (size_t j = 0; j < ratios.size(); ++j) counted_[ratios[j]] = counts[j];
    cand_lo_ = collect;
    chain_.clear();
  }

  // Buckets in->vals at the kRefine sub-thresholds of the interval; counts what lies above it.
  void Bucket(Interval* in) {
    const double w = std::ldexp(1.0, -(in->level + kRefineBits));
    in->edges.resize(kRefine + 1);
    for (int64_t s = 0; s <= kRefine; ++s)
      in->edges[s] = CeilToFloat(Threshold(mean_, u_, in->rl + w * static_cast<double>(s)));
    std::vector<int64_t> hist(kRefine + 1, 0);
    const float g0 = in->edges[0], top = in->edges[kRefine], span = top - g0;
    const float scale = span > 0 ? kRefine / span : 0.0f;
    for (float a : in->vals) {
      if (a < g0) continue;
      if (a >= top) { hist[kRefine]++; continue; }
      int64_t s = std::min<int64_t>(kRefine - 1, static_cast<int64_t>((a - g0) * scale));
      while (s + 1 < kRefine && a >= in->edges[s + 1]) ++s;
      while (s > 0 && a < in->edges[s]) --s;
      hist[s]++;
    }
    in->above += hist[kRefine];  // the root's entries at or above thres(1)
    in->suffix.assign(kRefine + 1, 0);
    for (int64_t s = kRefine - 1; s >= 0; --s) in->suffix[s] = in->suffix[s + 1] + hist[s];
  }

  tensorflow::OpKernelContext* ctx_;
  const T* x_;
  int64_t d_, expected_;
  AbsStats stats_;
  double mean_ = 0, u_ = 0;
  std::map<double, int64_t> counted_;  // probes answered exactly by a Split pass
  std::vector<Entry> cand_;            // every entry with a >= cand_lo_, in index order
  double cand_lo_ = kNoUpper;          // NaN: nothing collected
  std::vector<Interval> chain_;        // nested intervals of the current search path
};

}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_TOPK_PROBE_ENGINE_H_
