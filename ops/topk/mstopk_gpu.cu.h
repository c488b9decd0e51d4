// MSTopK (shi2021 Alg. 1) on the GPU, bit-identical to tests/reference.py::mstopk and the CPU
// kernel. Plain CUDA, no TensorFlow: mstopk_kernels.cu.cc and scripts/cuda_harness compile it.
//
// 1. ChunkStatsKernel: one block per kChunk chunk; 16 threads sum the lanes of mstopk.h in float64,
//    sequentially, from a shared-memory tile; thread 0 adds the 16 lanes in order; the host adds
//    the chunk sums in order (mean). Also the finite max u and the NaN / Inf counts.
// 2. The binary search runs on the host in MstopkSearch (mstopk.h), as on the CPU, so the
//    thresholds are the same float64 values. One ProbeHistKernel pass answers kLevels levels: it
//    counts against every probe of the 2^kLevels - 1 node subtree below the current (l, r).
//    After the first pass the entries between the thresholds of the leaf interval are gathered
//    (GatherBandKernel, select_gpu.cu.h); later passes read only those.
// 3. The selection (select_gpu.cu.h): a >= thres1 in index order, then band entries
//    [start, start + k - k1) of thres2 <= a < thres1.
//
// Host float64 arithmetic must not be contracted into FMAs (thresholds): build with
// -Xcompiler -ffp-contract=off, as for the CPU kernels. The device only compares.
#ifndef TF_COMMLIB_OPS_TOPK_MSTOPK_GPU_CU_H_
#define TF_COMMLIB_OPS_TOPK_MSTOPK_GPU_CU_H_

#include <cfloat>
#include <cstring>
#include <limits>
#include <vector>

#include "topk/mstopk.h"
#include "topk/select_gpu.cu.h"

namespace tf_commlib {
namespace gpu {

constexpr int kStatsTile = 4096;  // entries staged in shared memory per step of ChunkStatsKernel
constexpr int kLevels = 8;        // search levels answered by one histogram pass
constexpr int kProbes = (1 << kLevels) - 1;
static_assert(kChunk % kStatsTile == 0 && kStatsTile % kBlock == 0 && kStatsTile % kLanes == 0, "");

struct StatsAccum {
  unsigned long long n_inf, n_nan;
  unsigned int max_bits;  // bits of the finite max (a >= 0, so integer order = float order)
};
struct ProbeSet { double t[kProbes]; };  // ascending; unused entries +inf

// What the op reports: thresholds = [thres1, thres2, mean, u], counts = [k1, k2, start, n_inf].
// nan_rejected: x has n_nan NaN and allow_nan is false; nothing was selected.
struct MstopkInfo {
  double thres1 = 0, thres2 = 0, mean = 0, u = 0;
  int64_t k1 = 0, k2 = 0, start = 0, n_inf = 0, n_nan = 0;
  bool nan_rejected = false;
};

template <typename T>
__global__ void ChunkStatsKernel(const T* __restrict__ x, int64_t d, double* chunk_sum,
                                 StatsAccum* acc) {
  __shared__ float tile[kStatsTile];
  __shared__ double lane_sum[kLanes];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kChunk;
  float mx = 0.0f;
  unsigned n_inf = 0, n_nan = 0;
  double lane = 0.0;  // threads [0, kLanes): the running sum of lane threadIdx.x
  for (int t0 = 0; t0 < kChunk; t0 += kStatsTile) {
#pragma unroll  // launched with kBlock threads: kStatsTile / kBlock independent loads each
    for (int r = 0; r < kStatsTile / kBlock; ++r) {
      const int j = r * kBlock + threadIdx.x;
      const int64_t i = c0 + t0 + j;
      float a = 0.0f;  // the zero padding of the last chunk
      if (i < d) {
        const float v = ToFloat(x[i]);
        n_nan += v != v;
        n_inf += isinf(v);
        a = fabsf(v) <= FLT_MAX ? fabsf(v) : 0.0f;  // NaN and Inf add nothing
        mx = fmaxf(mx, a);
      }
      tile[j] = a;
    }
    __syncthreads();
    if (threadIdx.x < kLanes) {
#pragma unroll 16
      for (int t = threadIdx.x; t < kStatsTile; t += kLanes) lane += static_cast<double>(tile[t]);
    }
    __syncthreads();
  }
  if (threadIdx.x < kLanes) lane_sum[threadIdx.x] = lane;
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, o));
    n_inf += __shfl_xor_sync(~0u, n_inf, o);
    n_nan += __shfl_xor_sync(~0u, n_nan, o);
  }
  if (threadIdx.x % kWarp == 0) {
    atomicMax(&acc->max_bits, __float_as_uint(mx));
    if (n_inf) atomicAdd(&acc->n_inf, static_cast<unsigned long long>(n_inf));
    if (n_nan) atomicAdd(&acc->n_nan, static_cast<unsigned long long>(n_nan));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int j = 0; j < kLanes; ++j) s += lane_sum[j];
    chunk_sum[blockIdx.x] = s;
  }
}

// hist[p] += number of entries a with exactly p probes <= a, for p >= 1 (entries below every
// probe are not counted). src is x, or gathered a values (T = float, already |x|).
template <typename T>
__global__ void ProbeHistKernel(const T* __restrict__ src, int64_t n, ProbeSet probes,
                                unsigned long long* hist) {
  __shared__ double t[kProbes];
  __shared__ unsigned int h[kProbes + 1];
  for (int j = threadIdx.x; j < kProbes; j += blockDim.x) t[j] = probes.t[j];
  for (int j = threadIdx.x; j <= kProbes; j += blockDim.x) h[j] = 0;
  __syncthreads();
  const double lowest = t[0];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double a = AbsOf(src[i]);
    if (a < lowest) continue;
    int p = 0;  // branch-free upper bound: the number of probes <= a
#pragma unroll
    for (int s = (kProbes + 1) / 2; s > 0; s >>= 1) p += t[p + s - 1] <= a ? s : 0;
    atomicAdd(&h[p], 1u);
  }
  __syncthreads();
  for (int j = threadIdx.x; j <= kProbes; j += blockDim.x)
    if (h[j]) atomicAdd(&hist[j], static_cast<unsigned long long>(h[j]));
}

// Device scratch of Mstopk, carved from one allocation of MstopkWorkspaceBytes(d) bytes.
struct MstopkWorkspace {
  double* chunk_sum = nullptr;
  StatsAccum* acc = nullptr;
  unsigned long long* hist = nullptr;      // kProbes + 1
  unsigned long long* counters = nullptr;  // 2
  float* cand = nullptr;
  int64_t cand_cap = 0;
  ulonglong2* seg = nullptr;
};

inline int64_t NumChunks(int64_t d) { return (d + kChunk - 1) / kChunk; }

inline size_t CarveWorkspace(int64_t d, void* base, MstopkWorkspace* w) {
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* p = static_cast<char*>(base) + off;
    off += (bytes + 255) & ~static_cast<size_t>(255);
    return static_cast<void*>(p);
  };
  w->cand_cap = std::max<int64_t>(std::min<int64_t>(d, 1 << 20), d / 16);
  w->chunk_sum = static_cast<double*>(take(NumChunks(d) * sizeof(double)));
  w->acc = static_cast<StatsAccum*>(take(sizeof(StatsAccum)));
  w->hist = static_cast<unsigned long long*>(take((kProbes + 1) * sizeof(unsigned long long)));
  w->counters = static_cast<unsigned long long*>(take(2 * sizeof(unsigned long long)));
  w->cand = static_cast<float*>(take(w->cand_cap * sizeof(float)));
  w->seg = static_cast<ulonglong2*>(take(SelectWorkspaceBytes(d)));
  return off;
}

inline size_t MstopkWorkspaceBytes(int64_t d) {
  MstopkWorkspace w;
  return CarveWorkspace(d, nullptr, &w);
}

// Runs `m` levels of the search s with one histogram pass over src (n entries; `above` more entries
// lie above every probe). cnt_l / cnt_r track the counts at s.l / s.r (bounds d / 0 before a probe).
template <typename S>
cudaError_t SearchLevels(const S* src, int64_t n, int64_t above, int m, const MstopkWorkspace& w,
                         cudaStream_t stream, MstopkSearch* s, int64_t* cnt_l, int64_t* cnt_r) {
  const int n_nodes = (1 << m) - 1;  // heap order: node v has children 2v (nnz <= k) and 2v + 1
  double lo[kProbes + 1], hi[kProbes + 1], ratio[kProbes + 1], thr[kProbes + 1];
  lo[1] = s->l, hi[1] = s->r;
  for (int v = 1; v <= n_nodes; ++v) {
    MstopkSearch at = *s;  // NextRatio exactly as the search will compute it
    at.l = lo[v], at.r = hi[v];
    ratio[v] = at.NextRatio();
    thr[v] = Threshold(s->mean, s->u, ratio[v]);
    if (2 * v + 1 <= n_nodes) {
      lo[2 * v] = lo[v], hi[2 * v] = ratio[v];
      lo[2 * v + 1] = ratio[v], hi[2 * v + 1] = hi[v];
    }
  }
  int order[kProbes];
  for (int j = 0; j < n_nodes; ++j) order[j] = j + 1;
  std::sort(order, order + n_nodes, [&](int a, int b) { return thr[a] < thr[b]; });
  ProbeSet probes;
  for (int j = 0; j < kProbes; ++j)
    probes.t[j] = j < n_nodes ? thr[order[j]] : std::numeric_limits<double>::infinity();

  unsigned long long h[kProbes + 1] = {0};
  if (n > 0) {  // (no entries left between the probes: every count is `above`)
    TFC_CUDA_TRY(cudaMemsetAsync(w.hist, 0, sizeof(h), stream));
    ProbeHistKernel<S><<<GridFor(n), kBlock, 0, stream>>>(src, n, probes, w.hist);
    TFC_CUDA_TRY(cudaGetLastError());
    TFC_CUDA_TRY(cudaMemcpyAsync(h, w.hist, sizeof(h), cudaMemcpyDeviceToHost, stream));
    TFC_CUDA_TRY(cudaStreamSynchronize(stream));
  }

  int64_t count[kProbes + 1];  // by node: entries >= its threshold
  int64_t running = above;
  for (int j = kProbes - 1; j >= 0; --j) {
    running += static_cast<int64_t>(h[j + 1]);
    if (j < n_nodes) count[order[j]] = running;
  }
  for (int level = 0, v = 1; level < m; ++level) {
    if (s->NextRatio() != ratio[v]) return cudaErrorInvalidValue;  // the tree mirrors s
    const int64_t nnz = count[v];
    s->Observe(nnz);
    if (nnz <= s->k) *cnt_r = nnz, v = 2 * v;
    else *cnt_l = nnz, v = 2 * v + 1;
  }
  return cudaSuccess;
}

// MSTopK of x[0, d). indices (and values, unless null) must hold min(k, d) entries; workspace
// MstopkWorkspaceBytes(d) bytes of device memory. Synchronizes `stream` a few times (the search
// runs on the host); the selection itself is left queued on the stream.
template <typename T, typename Tidx>
cudaError_t Mstopk(const T* x, int64_t d, int64_t k, int num_samplings, uint64_t seed,
                   bool allow_nan, void* workspace, Tidx* indices, T* values, MstopkInfo* info,
                   cudaStream_t stream) {
  *info = MstopkInfo();
  if (d <= 0 || k <= 0 || num_samplings < 1 || num_samplings > kMaxSamplings)
    return cudaErrorInvalidValue;
  MstopkWorkspace w;
  CarveWorkspace(d, workspace, &w);
  const int64_t n_chunks = NumChunks(d);
  TFC_CUDA_TRY(cudaMemsetAsync(w.acc, 0, sizeof(StatsAccum), stream));
  ChunkStatsKernel<T><<<static_cast<unsigned>(n_chunks), kBlock, 0, stream>>>(x, d, w.chunk_sum,
                                                                              w.acc);
  TFC_CUDA_TRY(cudaGetLastError());
  std::vector<double> sums(n_chunks);
  StatsAccum acc;
  TFC_CUDA_TRY(cudaMemcpyAsync(sums.data(), w.chunk_sum, n_chunks * sizeof(double),
                               cudaMemcpyDeviceToHost, stream));
  TFC_CUDA_TRY(cudaMemcpyAsync(&acc, w.acc, sizeof(acc), cudaMemcpyDeviceToHost, stream));
  TFC_CUDA_TRY(cudaStreamSynchronize(stream));
  double sum = 0.0;
  for (double c : sums) sum += c;  // chunks in order
  float u;
  std::memcpy(&u, &acc.max_bits, sizeof(u));
  info->n_inf = static_cast<int64_t>(acc.n_inf);
  info->n_nan = static_cast<int64_t>(acc.n_nan);
  info->u = u;
  info->mean = d > info->n_inf ? sum / static_cast<double>(d - info->n_inf) : 0.0;
  if (info->n_nan > 0 && !allow_nan) {
    info->nan_rejected = true;
    return cudaSuccess;
  }

  const double inf = std::numeric_limits<double>::infinity();
  double t1, t2;
  SelectWindow win;
  if (k >= d) {  // everything, in index order
    t1 = t2 = -inf;
    win.lim1 = info->k1 = info->k2 = d;
  } else if (info->n_inf >= k) {  // the first k infinite entries
    t1 = t2 = info->thres1 = info->thres2 = inf;
    win.lim1 = info->k1 = k;
    info->k2 = info->n_inf;
  } else {
    MstopkSearch s(info->mean, info->u, k, d);
    const float* cand = nullptr;  // once set, later passes read the gathered band only
    int64_t n_cand = 0, above = 0, cnt_l = d, cnt_r = 0;
    for (int left = num_samplings; left > 0;) {
      const int m = std::min(left, kLevels);
      TFC_CUDA_TRY(cand ? SearchLevels(cand, n_cand, above, m, w, stream, &s, &cnt_l, &cnt_r)
                        : SearchLevels(x, d, 0, m, w, stream, &s, &cnt_l, &cnt_r));
      left -= m;
      // Later probes lie between the thresholds at s.l and s.r (Threshold is monotone in the
      // ratio), so only the entries between those matter, and how many lie above them.
      if (left > 0 && cand == nullptr && s.u - s.mean >= 0 && cnt_l - cnt_r <= w.cand_cap) {
        unsigned long long c[2];
        TFC_CUDA_TRY(cudaMemsetAsync(w.counters, 0, sizeof(c), stream));
        GatherBandKernel<T><<<GridFor(d), kBlock, 0, stream>>>(
            x, d, Threshold(s.mean, s.u, s.l), Threshold(s.mean, s.u, s.r), w.cand, w.cand_cap,
            w.counters);
        TFC_CUDA_TRY(cudaGetLastError());
        TFC_CUDA_TRY(cudaMemcpyAsync(c, w.counters, sizeof(c), cudaMemcpyDeviceToHost, stream));
        TFC_CUDA_TRY(cudaStreamSynchronize(stream));
        if (c[0] <= static_cast<unsigned long long>(w.cand_cap)) {
          cand = w.cand;
          n_cand = static_cast<int64_t>(c[0]);
          above = static_cast<int64_t>(c[1]);
        }
      }
    }
    s.Finish(info->n_inf);
    info->start = s.BandStart(seed);
    info->thres1 = t1 = s.thres1;
    info->thres2 = t2 = s.thres2;
    info->k1 = s.k1, info->k2 = s.k2;
    win.lim1 = win.band_pos = s.k1;  // band entries follow the k1 entries >= thres1
    win.band_start = info->start, win.band_len = k - s.k1;
  }
  TFC_CUDA_TRY(SelectCount(x, d, t1, t2, w.seg, stream));
  return SelectWrite(x, d, t1, t2, w.seg, win, indices, values, stream);
}

}  // namespace gpu
}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_TOPK_MSTOPK_GPU_CU_H_
