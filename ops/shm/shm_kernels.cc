// CPU kernels of CommlibShmReduceScatter and CommlibShmAllgather.
//
// Both are async: the wait for the other ranks runs on its own thread, so a graph with several
// collectives in flight never blocks TensorFlow's thread pools (the ranks may start them in
// different orders). Every rank of the set must run each op the same number of times.
#include <algorithm>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "shm/shm_segment.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.h"

namespace tf_commlib {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;

// What a call needs of its kernel, copied into the call's thread (it must not touch the kernel).
struct ShmParams {
  std::string segment;
  int rank, size;
  float timeout;

  // Arrives at the barrier; the first barrier of a channel is where every rank has mapped it.
  Status Arrive(ShmChannel* ch, const char* op) const {
    Status st = Barrier(ch, rank, size, timeout, op);
    if (ch->fresh) {
      Unlink(segment + ".ctl");
      ch->fresh = false;
    }
    return st;
  }

  // The name of a data segment of the channel. A failed call moves every rank to a new epoch, so
  // no rank re-creates a name that a slower rank is about to unlink.
  std::string Data(const ShmChannel* ch, const char* kind, int64_t size) const {
    return segment + ".e" + std::to_string(ch->epoch) + kind + std::to_string(size);
  }

  // Every rank unmaps the channel's data segments and moves to the next epoch.
  void Forget(ShmChannel* ch) const {
    ForgetData(segment + ".");
    ++ch->epoch;
  }

  // After the exchange: this rank's own error, else the first rank whose `table` entry says it
  // failed. Every rank then forgets the call's data segments and raises.
  Status AllSucceeded(ShmChannel* ch, const Status& local, const int64_t* table, int64_t failed,
                      const char* op) const {
    Status st = local;
    for (int j = 0; j < size && st.ok(); ++j) {
      if (table[j] == failed) st = errors::Aborted(op, ": rank ", j, " of the process set failed this call");
    }
    if (!st.ok()) Forget(ch);
    return st;
  }

  // Each rank's entry of a parity's table must equal this rank's.
  Status SameOnAllRanks(ShmChannel* ch, const int64_t* table, const char* what, const char* op) const {
    bool same = true;
    std::string all;
    for (int j = 0; j < size; ++j) {
      same = same && table[j] == table[rank];
      all += (j ? ", " : "") + std::to_string(table[j]);
    }
    if (same) return tensorflow::OkStatus();
    Forget(ch);
    return errors::InvalidArgument(op, ": ranks of the process set passed tensors with different ", what,
                                   " (by rank of the set: ", all, "); this is rank ", rank);
  }
};

// Collective::Run(params, ctx, x, channel, parity) runs one call; parity alternates between calls.
// A call that fails on one rank still goes through every barrier and says so in the control
// segment, so all ranks raise together and stay in step; only a timeout closes the channel.
template <typename Collective>
class ShmOp : public AsyncOpKernel {
 public:
  explicit ShmOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("segment", &params_.segment));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rank", &params_.rank));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("size", &params_.size));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &params_.timeout));
    OP_REQUIRES(ctx, params_.size >= 1 && params_.size <= kMaxShmRanks && params_.rank >= 0 &&
                         params_.rank < params_.size,
                errors::InvalidArgument("shm collective: need 0 <= rank < size <= ", kMaxShmRanks,
                                        ", got rank ", params_.rank, ", size ", params_.size));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto call = [params = params_, ctx, x = ctx->input(0), done] {
      ShmChannel* ch = nullptr;
      Status st = OpenChannel(params.segment + ".ctl", &ch);
      if (st.ok()) {
        std::lock_guard<std::mutex> lock(ch->mu);
        st = ch->broken;
        if (st.ok()) st = Collective::Run(params, ctx, x, ch, ch->calls++ & 1);
        if (tensorflow::errors::IsDeadlineExceeded(st) || ch->control->abandoned.load()) ch->broken = st;
      }
      ctx->SetStatus(st);
      done();
    };
    try {
      std::thread(call).detach();
    } catch (const std::system_error& e) {
      ctx->SetStatus(errors::ResourceExhausted("shm collective: cannot start a thread: ", e.what()));
      done();
    }
  }

 private:
  ShmParams params_;
};

// Rank r writes the blocks j != r of its input into its slot, waits, then sums block r of every
// rank in rank order (its own block from its input): the (p-1)/p volume of eq. (7). Two slot sets
// alternate between calls, so one barrier per call suffices: a rank writes set p again only after
// all ranks passed the next call's barrier, i.e. finished reading set p.
struct ShmReduceScatter {
  static Status Run(const ShmParams& P, OpKernelContext* ctx, const Tensor& x, ShmChannel* ch, int p) {
    const char* op = "shm reduce-scatter";
    const int64_t n = x.NumElements(), s = n / P.size, slot = (P.size - 1) * s;
    // slot[src] holds src's blocks for the other ranks: block j at position j - (j > src)
    const std::string data = P.Data(ch, ".rs", n);
    Status local = (x.dims() == 1 && n % P.size == 0)
        ? tensorflow::OkStatus()
        : errors::InvalidArgument(op, ": x must be a vector whose length is a multiple of the set size ",
                                  P.size, ", got shape ", x.shape().DebugString());
    Tensor* out = nullptr;
    if (local.ok()) local = ctx->allocate_output(0, TensorShape({s}), &out);
    char* base = nullptr;
    bool fresh = false;
    if (local.ok()) local = MapData(data, sizeof(float) * 2 * P.size * std::max<int64_t>(slot, 1), &base, &fresh);
    float* slots = reinterpret_cast<float*>(base) + static_cast<int64_t>(p) * P.size * slot;
    const float* in = x.flat<float>().data();
    if (local.ok()) {
      for (int j = 0; j < P.size; ++j) {
        if (j != P.rank) std::memcpy(slots + P.rank * slot + (j - (j > P.rank)) * s, in + j * s, sizeof(float) * s);
      }
    }
    ShmControl* c = ch->control;
    c->rows[p][P.rank] = local.ok() ? n : kFailed;
    Status st = P.Arrive(ch, op);
    if (fresh) Unlink(data);
    TF_RETURN_IF_ERROR(st);
    TF_RETURN_IF_ERROR(P.AllSucceeded(ch, local, c->rows[p], kFailed, op));
    TF_RETURN_IF_ERROR(P.SameOnAllRanks(ch, c->rows[p], "lengths", op));
    std::vector<const float*> src(P.size);
    for (int j = 0; j < P.size; ++j) {
      src[j] = j == P.rank ? in + P.rank * s : slots + j * slot + (P.rank - (P.rank > j)) * s;
    }
    float* o = out->flat<float>().data();
    if (P.size == 1) {
      std::memcpy(o, src[0], sizeof(float) * s);
      return tensorflow::OkStatus();
    }
    for (int64_t i = 0; i < s; ++i) o[i] = src[0][i] + src[1][i];   // rank order: ((x0 + x1) + x2) ...
    for (int j = 2; j < P.size; ++j) {
      const float* q = src[j];
      for (int64_t i = 0; i < s; ++i) o[i] += q[i];
    }
    return tensorflow::OkStatus();
  }
};

// Rows of every rank, concatenated in rank order. The first barrier publishes the row counts and
// row shapes (every rank then knows the offsets), the second the rows; a rank writes the buffer
// again only after the next call's first barrier, when every rank has copied it out.
struct ShmAllgather {
  static int64_t RowShapeHash(const Tensor& x) {
    uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(x.dtype());
    for (int i = 1; i < x.dims(); ++i) h = (h ^ static_cast<uint64_t>(x.dim_size(i))) * 1099511628211ull;
    return static_cast<int64_t>((h ^ static_cast<uint64_t>(x.dims())) >> 1);   // >= 0, never kFailed
  }

  static Status Run(const ShmParams& P, OpKernelContext* ctx, const Tensor& x, ShmChannel* ch, int p) {
    const char* op = "shm allgather";
    Status local = x.dims() >= 1 && tensorflow::DataTypeCanUseMemcpy(x.dtype())
        ? tensorflow::OkStatus()
        : errors::InvalidArgument(op, ": x must have rank >= 1 and a numeric or bool dtype, got ",
                                  tensorflow::DataTypeString(x.dtype()), " of shape ", x.shape().DebugString());
    int64_t rows = 0, row_bytes = 0;
    if (local.ok()) {
      rows = x.dim_size(0);
      row_bytes = tensorflow::DataTypeSize(x.dtype());
      for (int i = 1; i < x.dims(); ++i) row_bytes *= x.dim_size(i);
    }
    ShmControl* c = ch->control;
    c->rows[p][P.rank] = local.ok() ? rows : kFailed;
    c->row_shape[p][P.rank] = local.ok() ? RowShapeHash(x) : 0;
    TF_RETURN_IF_ERROR(P.Arrive(ch, op));
    TF_RETURN_IF_ERROR(P.AllSucceeded(ch, local, c->rows[p], kFailed, op));
    TF_RETURN_IF_ERROR(P.SameOnAllRanks(ch, c->row_shape[p], "dtypes or row shapes (hashed)", op));
    int64_t total = 0, offset = 0;
    for (int j = 0; j < P.size; ++j) {
      if (j == P.rank) offset = total;
      total += c->rows[p][j];
    }
    size_t capacity = 4096;
    while (capacity < static_cast<size_t>(total * row_bytes)) capacity *= 2;
    const std::string data = P.Data(ch, ".ag", capacity);
    char* base = nullptr;
    bool fresh = false;
    local = MapData(data, capacity, &base, &fresh);
    if (local.ok()) std::memcpy(base + offset * row_bytes, x.tensor_data().data(), rows * row_bytes);
    c->mapped[p][P.rank] = local.ok();
    Status st = P.Arrive(ch, op);
    if (fresh) Unlink(data);
    TF_RETURN_IF_ERROR(st);
    TF_RETURN_IF_ERROR(P.AllSucceeded(ch, local, c->mapped[p], 0, op));
    TensorShape out_shape = x.shape();
    out_shape.set_dim(0, total);
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, out_shape, &out));
    std::memcpy(const_cast<char*>(out->tensor_data().data()), base, total * row_bytes);
    return tensorflow::OkStatus();
  }
};

REGISTER_KERNEL_BUILDER(Name("CommlibShmReduceScatter").Device(tensorflow::DEVICE_CPU), ShmOp<ShmReduceScatter>);
REGISTER_KERNEL_BUILDER(Name("CommlibShmAllgather").Device(tensorflow::DEVICE_CPU), ShmOp<ShmAllgather>);

}  // namespace tf_commlib
