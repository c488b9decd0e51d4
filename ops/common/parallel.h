// Deterministic block parallelism on TF's CPU worker pool.
// The range [0, n) is cut into a fixed number of contiguous blocks that depends only on n, so
// per-block partial results combined in block order give the same answer on every machine.
#ifndef TF_COMMLIB_OPS_COMMON_PARALLEL_H_
#define TF_COMMLIB_OPS_COMMON_PARALLEL_H_

#include <algorithm>
#include <cstdint>
#include <functional>

#include "tensorflow/core/framework/op_kernel.h"

namespace tf_commlib {

constexpr int64_t kMinBlock = 1 << 16;  // elements; below this a block is not worth a thread
constexpr int64_t kMaxBlocks = 64;

inline int64_t NumBlocks(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>(kMaxBlocks, n / kMinBlock));
}
inline int64_t BlockBegin(int64_t n, int64_t blocks, int64_t b) { return n * b / blocks; }

// Calls fn(block, begin, end) for every block, in parallel on the kernel's worker threads.
inline void ForEachBlock(tensorflow::OpKernelContext* ctx, int64_t n, int64_t blocks,
                         const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  auto body = [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b)
      fn(b, BlockBegin(n, blocks, b), BlockBegin(n, blocks, b + 1));
  };
  if (blocks == 1) {
    body(0, 1);
    return;
  }
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  // A cost per block far above the scheduler's threshold makes every block its own task.
  pool->ParallelFor(blocks, /*cost_per_unit=*/1 << 30, body);
}

}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_COMMON_PARALLEL_H_
