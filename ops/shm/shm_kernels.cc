// CPU kernels of CommlibShmReduceScatter and CommlibShmAllgather.
//
// Both are async: the wait for the other ranks runs on its own thread, so a graph with several
// collectives in flight never blocks TensorFlow's thread pools (the ranks may start them in
// different orders). Every rank of the set must run each op the same number of times. The
// segments and their checks are in shm_channel.h and shm_segment.h.
#include <algorithm>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "shm/shm_channel.h"
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

  ShmSet Set(const char* op) const { return ShmSet{rank, size, timeout, op}; }
};

// After the call's first barrier: this rank's own error, else the first rank that says it failed.
Status AllSucceeded(const ShmSet& set, const Status& local, const std::vector<ShmEntry>& entries) {
  Status st = local;
  for (int j = 0; j < set.size && st.ok(); ++j) {
    if (entries[j].rows == kFailed) st = errors::Aborted(set.op, ": rank ", j, " of the process set failed this call");
  }
  return st;
}

// The call's first barrier, then every rank's entry for the call (range-checked) and who failed it.
Status Exchange(ShmChannel* ch, const ShmSet& set, int p, const Status& local, std::vector<ShmEntry>* entries) {
  TF_RETURN_IF_ERROR(Barrier(ch, set));
  TF_RETURN_IF_ERROR(ReadEntries(ch, set, p, entries));
  return AllSucceeded(set, local, *entries);
}

// Each rank's value of an entry field must equal this rank's.
Status SameOnAllRanks(const ShmSet& set, const std::vector<ShmEntry>& entries, int64_t ShmEntry::*field,
                      const char* what) {
  bool same = true;
  std::string all;
  for (int j = 0; j < set.size; ++j) {
    same = same && entries[j].*field == entries[set.rank].*field;
    all += (j ? ", " : "") + std::to_string(entries[j].*field);
  }
  if (same) return tensorflow::OkStatus();
  return errors::InvalidArgument(set.op, ": ranks of the process set passed tensors with different ", what,
                                 " (by rank of the set: ", all, "); this is rank ", set.rank);
}

// The barrier after MapPeers: each rank says whether it mapped the call's new data segments, their
// creators unlink them, and a rank that could not map them makes every rank fail.
Status Mapped(ShmChannel* ch, const ShmSet& set, int p, const Status& mapped) {
  ch->control->entry[p][set.rank].mapped = mapped.ok();
  Status st = Barrier(ch, set);
  UnlinkOwn(ch);
  TF_RETURN_IF_ERROR(st);
  TF_RETURN_IF_ERROR(mapped);
  for (int j = 0; j < set.size; ++j) {
    const int64_t m = ch->control->entry[p][j].mapped;
    if (m == 0) return errors::Aborted(set.op, ": rank ", j, " of the process set could not map this call's shared memory");
    if (m != 1) return Invalid(ch, set, "mapped flag " + std::to_string(m) + " of rank " + std::to_string(j));
  }
  return tensorflow::OkStatus();
}

// Collective::Run(params, ctx, x, channel, parity) runs one call; parity alternates between calls.
// A call that fails on one rank still goes through the call's first barrier and says so in the
// control segment, so all ranks raise together and stay in step; a timeout or an invalid value in
// the control segment closes the channel.
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
    OP_REQUIRES(ctx, ValidName(params_.segment),
                errors::InvalidArgument("shm collective: segment must be 1 to 63 of [A-Za-z0-9_.-], got '",
                                        params_.segment, "'"));
    OP_REQUIRES(ctx, params_.timeout > 0 && params_.timeout < 1e9,
                errors::InvalidArgument("shm collective: timeout_seconds must be positive, got ", params_.timeout));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto call = [params = params_, ctx, x = ctx->input(0), done] {
      ShmChannel* ch = GetChannel(params.segment);
      Status st;
      {
        std::lock_guard<std::mutex> lock(ch->mu);
        st = ch->broken;
        if (st.ok() && !ch->control) st = OpenControl(ch, params.Set(Collective::kOp));
        if (st.ok()) st = Collective::Run(params, ctx, x, ch, ch->calls++ & 1);
        if (!st.ok() && ch->control && (tensorflow::errors::IsDeadlineExceeded(st) || ch->control->abandoned.load())) {
          ch->broken = st;
          Close(ch);
        }
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

// Rank r writes the blocks j != r of its input into its data segment, waits, then sums block r of
// every rank in rank order (its own block from its input): the (p-1)/p volume of eq. (7). The two
// halves of a data segment alternate between calls, so one barrier per call suffices: a rank writes
// a half again only after all ranks passed the next call's barrier, i.e. finished reading it.
struct ShmReduceScatter {
  static constexpr const char* kOp = "shm reduce-scatter";

  static Status Run(const ShmParams& P, OpKernelContext* ctx, const Tensor& x, ShmChannel* ch, int p) {
    const ShmSet set = P.Set(kOp);
    const int64_t n = x.NumElements(), s = n / P.size;
    const size_t half = sizeof(float) * (P.size - 1) * s;   // block j of rank r at j - (j > r)
    Status local = (x.dims() == 1 && n % P.size == 0)
        ? tensorflow::OkStatus()
        : errors::InvalidArgument(kOp, ": x must be a vector whose length is a multiple of the set size ",
                                  P.size, ", got shape ", x.shape().DebugString());
    Tensor* out = nullptr;
    if (local.ok()) local = ctx->allocate_output(0, TensorShape({s}), &out);
    if (local.ok()) local = EnsureOwn(ch, 2 * half);
    const float* in = x.flat<float>().data();
    if (local.ok()) {
      float* mine = reinterpret_cast<float*>(ch->own.segment.base + p * (ch->own.segment.bytes / 2));
      for (int j = 0; j < P.size; ++j) {
        if (j != P.rank) std::memcpy(mine + (j - (j > P.rank)) * s, in + j * s, sizeof(float) * s);
      }
    }
    Publish(ch, set, p, local.ok() ? n : kFailed, 0, 0);
    std::vector<ShmEntry> entries;
    Status st = Exchange(ch, set, p, local, &entries);
    if (st.ok()) st = SameOnAllRanks(set, entries, &ShmEntry::rows, "lengths");
    bool any_fresh = false;
    Status mapped;
    if (st.ok()) st = MapPeers(ch, set, entries, &any_fresh, &mapped);
    if (st.ok() && any_fresh) st = Mapped(ch, set, p, mapped);
    for (int j = 0; j < P.size && st.ok(); ++j) {
      if (j != P.rank && ch->peer[j].segment.bytes / 2 < half) {
        st = Invalid(ch, set, "data segment of rank " + std::to_string(j) + " too small");
      }
    }
    if (!st.ok()) {
      DropFresh(ch);
      return st;
    }
    std::vector<const float*> src(P.size);
    for (int j = 0; j < P.size; ++j) {
      const Segment& seg = ch->peer[j].segment;
      src[j] = j == P.rank ? in + P.rank * s
                           : reinterpret_cast<const float*>(seg.base + p * (seg.bytes / 2)) + (P.rank - (P.rank > j)) * s;
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
// row shapes; each rank then writes its rows into its data segment (every rank has finished reading
// the previous call's) and maps the others' new ones; after the second, it copies every rank's rows.
struct ShmAllgather {
  static constexpr const char* kOp = "shm allgather";

  static int64_t RowShapeHash(const Tensor& x) {
    uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(x.dtype());
    for (int i = 1; i < x.dims(); ++i) h = (h ^ static_cast<uint64_t>(x.dim_size(i))) * 1099511628211ull;
    return static_cast<int64_t>((h ^ static_cast<uint64_t>(x.dims())) >> 1);   // >= 0, never kFailed
  }

  static Status Run(const ShmParams& P, OpKernelContext* ctx, const Tensor& x, ShmChannel* ch, int p) {
    const ShmSet set = P.Set(kOp);
    Status local = x.dims() >= 1 && tensorflow::DataTypeCanUseMemcpy(x.dtype())
        ? tensorflow::OkStatus()
        : errors::InvalidArgument(kOp, ": x must have rank >= 1 and a numeric or bool dtype, got ",
                                  tensorflow::DataTypeString(x.dtype()), " of shape ", x.shape().DebugString());
    int64_t rows = 0, row_bytes = 0;
    if (local.ok()) {
      rows = x.dim_size(0);
      row_bytes = tensorflow::DataTypeSize(x.dtype());
      for (int i = 1; i < x.dims(); ++i) row_bytes *= x.dim_size(i);
      local = EnsureOwn(ch, rows * row_bytes);
    }
    Publish(ch, set, p, local.ok() ? rows : kFailed, local.ok() ? RowShapeHash(x) : 0, row_bytes);
    std::vector<ShmEntry> entries;
    Status st = Exchange(ch, set, p, local, &entries);
    if (st.ok()) st = SameOnAllRanks(set, entries, &ShmEntry::row_shape, "dtypes or row shapes (hashed)");
    if (st.ok()) st = SameOnAllRanks(set, entries, &ShmEntry::row_bytes, "row sizes");
    bool any_fresh = false;
    Status mapped;
    if (st.ok()) {
      std::memcpy(ch->own.segment.base, x.tensor_data().data(), rows * row_bytes);
      st = MapPeers(ch, set, entries, &any_fresh, &mapped);
    }
    if (st.ok()) st = Mapped(ch, set, p, mapped);
    int64_t total = 0;
    for (int j = 0; j < P.size && st.ok(); ++j) {
      const int64_t r = entries[j].rows;
      if (j != P.rank && row_bytes > 0 && r > static_cast<int64_t>(ch->peer[j].segment.bytes) / row_bytes) {
        st = Invalid(ch, set, std::to_string(r) + " rows of rank " + std::to_string(j) + " do not fit its data segment");
      }
      total += r;
    }
    if (!st.ok()) {
      DropFresh(ch);
      return st;
    }
    TensorShape out_shape = x.shape();
    out_shape.set_dim(0, total);
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, out_shape, &out));
    char* o = const_cast<char*>(out->tensor_data().data());
    for (int j = 0; j < P.size; ++j) {
      const int64_t bytes = entries[j].rows * row_bytes;
      std::memcpy(o, j == P.rank ? x.tensor_data().data() : ch->peer[j].segment.base, bytes);
      o += bytes;
    }
    return tensorflow::OkStatus();
  }
};

REGISTER_KERNEL_BUILDER(Name("CommlibShmReduceScatter").Device(tensorflow::DEVICE_CPU), ShmOp<ShmReduceScatter>);
REGISTER_KERNEL_BUILDER(Name("CommlibShmAllgather").Device(tensorflow::DEVICE_CPU), ShmOp<ShmAllgather>);

}  // namespace tf_commlib
