// CUDA stream compaction shared by the GPU top-k selectors (threshold_select and the selection step
// of MSTopK). Plain CUDA, no TensorFlow: the TF functors (*.cu.cc) and scripts/cuda_harness compile
// this very code.
//
// a = |x| as float32 with NaN read as 0, compared as (double)a >= t like the CPU kernels and
// tests/reference.py. Index order is kept without atomics: every warp owns a segment of kSegment
// consecutive entries; pass 1 counts per segment, one block scans the counts, pass 2 re-reads each
// segment and places its entries with ballot/popc ranks.
#ifndef TF_COMMLIB_OPS_TOPK_SELECT_GPU_CU_H_
#define TF_COMMLIB_OPS_TOPK_SELECT_GPU_CU_H_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#define TFC_CUDA_TRY(expr)                              \
  do {                                                  \
    const cudaError_t tfc_err_ = (expr);                \
    if (tfc_err_ != cudaSuccess) return tfc_err_;       \
  } while (0)

namespace tf_commlib {
namespace gpu {

constexpr int kWarp = 32;
constexpr int kBlock = 256;
constexpr int kSegRounds = 32;
constexpr int64_t kSegment = kWarp * kSegRounds;  // entries per warp segment
constexpr int kScanThreads = 1024;

template <typename T>
__device__ __forceinline__ float ToFloat(T v) { return static_cast<float>(v); }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }

// a = |x| as float32, NaN read as 0.
template <typename T>
__device__ __forceinline__ float AbsOf(T v) {
  const float a = fabsf(ToFloat(v));
  return a != a ? 0.0f : a;
}

// x with NaN written as 0 (the value output of every selector).
template <typename T>
__device__ __forceinline__ T NanToZero(T v) {
  const float f = ToFloat(v);
  return f != f ? static_cast<T>(0.0f) : v;
}
template <>
__device__ __forceinline__ __half NanToZero<__half>(__half v) {
  return __hisnan(v) ? __float2half(0.0f) : v;
}

// Grid for a grid-stride loop over n items: enough blocks to fill the device, no more.
inline unsigned GridFor(int64_t n, int per_block = kBlock) {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)
    sms = 80;
  const int64_t want = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(want, 8LL * sms)));
}

inline int64_t NumSegments(int64_t d) { return (d + kSegment - 1) / kSegment; }
// Bytes of device scratch the selection needs: per-segment counts, the totals, a NaN count.
inline size_t SelectWorkspaceBytes(int64_t d) {
  return static_cast<size_t>(NumSegments(d) + 2) * sizeof(ulonglong2);
}

// Where the selected entries go. Entries with a >= t1 of rank r < lim1 land at out[r]; band
// entries (t2 <= a < t1) of rank r in [band_start, band_start + band_len) at
// out[band_pos + r - band_start]. Ranks count in index order.
struct SelectWindow {
  int64_t lim1 = 0;
  int64_t band_start = 0, band_len = 0, band_pos = 0;
};

// seg[w] = {entries with a >= t1, entries with t2 <= a < t1} in warp segment w.
template <typename T>
__global__ void SegmentCountKernel(const T* __restrict__ x, int64_t d, double t1, double t2,
                                   ulonglong2* seg, int64_t n_seg) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (w >= n_seg) return;  // uniform over the warp
  unsigned long long n1 = 0, n2 = 0;
  for (int r = 0; r < kSegRounds; ++r) {
    const int64_t i = w * kSegment + r * kWarp + lane;
    const bool in = i < d;
    const double a = in ? AbsOf(x[i]) : 0.0;
    n1 += __popc(__ballot_sync(~0u, in && a >= t1));
    n2 += __popc(__ballot_sync(~0u, in && a < t1 && a >= t2));
  }
  if (lane == 0) seg[w] = make_ulonglong2(n1, n2);
}

__device__ __forceinline__ ulonglong2 operator+(ulonglong2 a, ulonglong2 b) {
  return make_ulonglong2(a.x + b.x, a.y + b.y);
}

// Inclusive scan over the 32 lanes of a warp.
__device__ __forceinline__ ulonglong2 WarpInclusiveScan(ulonglong2 v, int lane) {
  for (int o = 1; o < kWarp; o <<= 1) {
    const ulonglong2 u = make_ulonglong2(__shfl_up_sync(~0u, v.x, o), __shfl_up_sync(~0u, v.y, o));
    if (lane >= o) v = v + u;
  }
  return v;
}

// In-place exclusive scan of seg[0, n); seg[n] = the totals. One block of kScanThreads threads,
// each owning a contiguous run of segments. (A template, Seg = ulonglong2, so that several
// translation units of one library may include this header.)
template <typename Seg>
__global__ void SegmentScanKernel(Seg* seg, int64_t n) {
  __shared__ ulonglong2 warp_base[kScanThreads / kWarp];
  const int tid = threadIdx.x, lane = tid % kWarp, wid = tid / kWarp;
  const int64_t per = (n + kScanThreads - 1) / kScanThreads;
  const int64_t lo = tid * per < n ? tid * per : n, hi = lo + per < n ? lo + per : n;
  Seg own = make_ulonglong2(0, 0);
  for (int64_t i = lo; i < hi; ++i) own = own + seg[i];
  const ulonglong2 incl = WarpInclusiveScan(own, lane);
  if (lane == kWarp - 1) warp_base[wid] = incl;
  __syncthreads();
  if (wid == 0) {
    const ulonglong2 tot = warp_base[lane];
    const ulonglong2 wincl = WarpInclusiveScan(tot, lane);
    warp_base[lane] = make_ulonglong2(wincl.x - tot.x, wincl.y - tot.y);
    if (lane == kWarp - 1) seg[n] = wincl;
  }
  __syncthreads();
  ulonglong2 run = warp_base[wid] + make_ulonglong2(incl.x - own.x, incl.y - own.y);
  for (int64_t i = lo; i < hi; ++i) {
    const ulonglong2 c = seg[i];
    seg[i] = run;
    run = run + c;
  }
}

template <typename T, typename Tidx>
__device__ __forceinline__ void Emit(const T* x, int64_t i, int64_t pos, Tidx* idx, T* val) {
  idx[pos] = static_cast<Tidx>(i);
  if (val != nullptr) val[pos] = NanToZero(x[i]);
}

// Pass 2: seg holds the exclusive ranks from SegmentScanKernel.
template <typename T, typename Tidx>
__global__ void SegmentWriteKernel(const T* __restrict__ x, int64_t d, double t1, double t2,
                                   const ulonglong2* seg, int64_t n_seg, SelectWindow win,
                                   Tidx* idx, T* val) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (w >= n_seg) return;
  int64_t r1 = static_cast<int64_t>(seg[w].x), r2 = static_cast<int64_t>(seg[w].y);
  const int64_t e1 = static_cast<int64_t>(seg[w + 1].x), e2 = static_cast<int64_t>(seg[w + 1].y);
  const bool want1 = e1 > r1 && r1 < win.lim1;
  const bool want2 = e2 > r2 && e2 > win.band_start && r2 < win.band_start + win.band_len;
  if (!want1 && !want2) return;  // nothing of this segment is written: skip reading it
  const unsigned below = (1u << lane) - 1u;
  for (int r = 0; r < kSegRounds; ++r) {
    const int64_t i = w * kSegment + r * kWarp + lane;
    const bool in = i < d;
    const double a = in ? AbsOf(x[i]) : 0.0;
    const bool f1 = in && a >= t1, f2 = in && a < t1 && a >= t2;
    const unsigned b1 = __ballot_sync(~0u, f1), b2 = __ballot_sync(~0u, f2);
    if (f1) {
      const int64_t p = r1 + __popc(b1 & below);
      if (p < win.lim1) Emit(x, i, p, idx, val);
    }
    if (f2) {
      const int64_t q = r2 + __popc(b2 & below) - win.band_start;
      if (q >= 0 && q < win.band_len) Emit(x, i, win.band_pos + q, idx, val);
    }
    r1 += __popc(b1);
    r2 += __popc(b2);
  }
}

// Copies every a with lo <= a < hi into cand (first cap of them, any order) and counts them
// (counters[0]) and the entries with a >= hi (counters[1]).
template <typename T>
__global__ void GatherBandKernel(const T* __restrict__ x, int64_t d, double lo, double hi,
                                 float* cand, int64_t cap, unsigned long long* counters) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned long long above = 0;
  for (int64_t i = warp * kWarp + lane; i - lane < d; i += step) {  // warp-uniform trip count
    const bool valid = i < d;
    const float a = valid ? AbsOf(x[i]) : 0.0f;
    const bool in = valid && a >= lo && a < hi;
    above += valid && a >= hi;
    const unsigned b = __ballot_sync(~0u, in);
    if (b == 0) continue;
    unsigned long long first = 0;
    if (lane == 0) first = atomicAdd(&counters[0], static_cast<unsigned long long>(__popc(b)));
    first = __shfl_sync(~0u, first, 0);
    const unsigned long long p = first + __popc(b & ((1u << lane) - 1u));
    if (in && p < static_cast<unsigned long long>(cap)) cand[p] = a;
  }
  for (int o = kWarp / 2; o > 0; o >>= 1) above += __shfl_xor_sync(~0u, above, o);
  if (lane == 0 && above) atomicAdd(&counters[1], above);
}

inline unsigned SegmentBlocks(int64_t n_seg) {
  const int64_t warps = kBlock / kWarp;
  return static_cast<unsigned>((n_seg + warps - 1) / warps);
}

// Pass 1 + scan. Afterwards seg[NumSegments(d)] = {#(a >= t1), #(t2 <= a < t1)} on the device.
template <typename T>
cudaError_t SelectCount(const T* x, int64_t d, double t1, double t2, ulonglong2* seg,
                        cudaStream_t stream) {
  const int64_t n_seg = NumSegments(d);
  if (n_seg == 0) return cudaMemsetAsync(seg, 0, sizeof(ulonglong2), stream);
  SegmentCountKernel<T><<<SegmentBlocks(n_seg), kBlock, 0, stream>>>(x, d, t1, t2, seg, n_seg);
  SegmentScanKernel<ulonglong2><<<1, kScanThreads, 0, stream>>>(seg, n_seg);
  return cudaGetLastError();
}

// Pass 2, after SelectCount with the same x, d, t1, t2 and seg.
template <typename T, typename Tidx>
cudaError_t SelectWrite(const T* x, int64_t d, double t1, double t2, const ulonglong2* seg,
                        const SelectWindow& win, Tidx* idx, T* val, cudaStream_t stream) {
  const int64_t n_seg = NumSegments(d);
  if (n_seg == 0) return cudaSuccess;
  SegmentWriteKernel<T, Tidx>
      <<<SegmentBlocks(n_seg), kBlock, 0, stream>>>(x, d, t1, t2, seg, n_seg, win, idx, val);
  return cudaGetLastError();
}

// *counter += the number of NaN in x.
template <typename T>
__global__ void CountNanKernel(const T* __restrict__ x, int64_t d, unsigned long long* counter) {
  unsigned long long c = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < d; i += stride) {
    const float v = ToFloat(x[i]);
    c += v != v;
  }
  for (int o = kWarp / 2; o > 0; o >>= 1) c += __shfl_xor_sync(~0u, c, o);
  if (threadIdx.x % kWarp == 0 && c) atomicAdd(counter, c);
}

// threshold_select, pass 1: counts the entries with a >= t (and the NaN, if count_nan) into the
// workspace (SelectWorkspaceBytes(d) bytes). ReadThresholdCount brings the counts to the host.
template <typename T>
cudaError_t ThresholdSelectCount(const T* x, int64_t d, double t, bool count_nan, void* workspace,
                                 cudaStream_t stream) {
  ulonglong2* seg = static_cast<ulonglong2*>(workspace);
  TFC_CUDA_TRY(cudaMemsetAsync(seg + NumSegments(d) + 1, 0, sizeof(ulonglong2), stream));
  if (count_nan && d > 0)
    CountNanKernel<T><<<GridFor(d), kBlock, 0, stream>>>(x, d, &seg[NumSegments(d) + 1].x);
  TFC_CUDA_TRY(cudaGetLastError());
  return SelectCount(x, d, t, t, seg, stream);
}

// Synchronizes the stream.
inline cudaError_t ReadThresholdCount(const void* workspace, int64_t d, int64_t* n, int64_t* n_nan,
                                      cudaStream_t stream) {
  ulonglong2 c[2];  // {selected, -}, {NaN, -}
  TFC_CUDA_TRY(cudaMemcpyAsync(c, static_cast<const ulonglong2*>(workspace) + NumSegments(d),
                               sizeof(c), cudaMemcpyDeviceToHost, stream));
  TFC_CUDA_TRY(cudaStreamSynchronize(stream));
  *n = static_cast<int64_t>(c[0].x);
  *n_nan = static_cast<int64_t>(c[1].x);
  return cudaSuccess;
}

// threshold_select, pass 2: writes the n selected entries (indices, and values unless val is null)
// in index order.
template <typename T, typename Tidx>
cudaError_t ThresholdSelectWrite(const T* x, int64_t d, double t, int64_t n, const void* workspace,
                                 Tidx* idx, T* val, cudaStream_t stream) {
  SelectWindow win;
  win.lim1 = n;
  return SelectWrite(x, d, t, t, static_cast<const ulonglong2*>(workspace), win, idx, val, stream);
}

}  // namespace gpu
}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_TOPK_SELECT_GPU_CU_H_
