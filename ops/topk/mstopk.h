// Device-independent definitions of MSTopK (shi2021 Alg. 1) shared by the CPU and CUDA kernels
// and mirrored by the numpy reference in tests/reference.py.
//
// a_i = |x_i| as float32, NaN counted as 0 (only when allowed), +-Inf always selected first.
// mean  = S / (d - n_inf), where S is the sum of the finite a_i in float64 taken in a fixed order:
//         chunks of kChunk elements (the last one zero-padded), inside a chunk kLanes lane sums
//         a[c*kChunk + t*kLanes + j] sequential in t, then the lanes sequentially, then the chunks
//         sequentially. The order does not depend on the thread count or device, so every
//         implementation gets the same bits.
// u     = max of the finite a_i.
// thres(ratio) = mean + ratio * (u - mean) in float64; probes compare (double)a_i >= thres.
#ifndef TF_COMMLIB_OPS_TOPK_MSTOPK_H_
#define TF_COMMLIB_OPS_TOPK_MSTOPK_H_

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__CUDACC__)
#define TFC_HOST_DEVICE __host__ __device__
#else
#define TFC_HOST_DEVICE
#endif

namespace tf_commlib {

constexpr int64_t kLanes = 16;
constexpr int64_t kChunk = 16384;  // a multiple of kLanes
constexpr int kMaxSamplings = 52;  // ratios stay exact dyadic float64 numbers

TFC_HOST_DEVICE inline uint64_t SplitMix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

TFC_HOST_DEVICE inline double Threshold(double mean, double u, double ratio) {
  return mean + ratio * (u - mean);
}

// The binary search of Algorithm 1, fed one probe count at a time.
struct MstopkSearch {
  double mean, u;
  int64_t k, d;
  double l = 0.0, r = 1.0;
  int64_t k1 = 0, k2;  // counts at thres1 / thres2
  double thres1 = 0.0, thres2 = 0.0;
  bool has1 = false, has2 = false;

  MstopkSearch(double mean_, double u_, int64_t k_, int64_t d_)
      : mean(mean_), u(u_), k(k_), d(d_), k2(d_) {}
  double NextRatio() const { return l + (r - l) / 2; }
  void Observe(int64_t nnz) {
    const double ratio = NextRatio();
    if (nnz <= k) {
      r = ratio;
      if (nnz > k1) { k1 = nnz; thres1 = Threshold(mean, u, ratio); has1 = true; }
    } else {
      l = ratio;
      if (nnz < k2) { k2 = nnz; thres2 = Threshold(mean, u, ratio); has2 = true; }
    }
  }
  // After the loop: an unset thres1 selects only the infinite entries (k1 = n_inf); an unset
  // thres2 leaves the band open down to 0 (k2 = d, every entry).
  void Finish(int64_t n_inf) {
    if (!has1) { thres1 = std::numeric_limits<double>::infinity(); k1 = n_inf; }
    if (!has2) { thres2 = 0.0; k2 = d; }
  }
  // Start of the contiguous run of k - k1 band entries (band = thres2 <= a < thres1, k2 - k1 long).
  int64_t BandStart(uint64_t seed) const {
    const uint64_t choices = static_cast<uint64_t>((k2 - k1) - (k - k1) + 1);
    return static_cast<int64_t>(SplitMix64(seed) % choices);
  }
};

}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_TOPK_MSTOPK_H_
