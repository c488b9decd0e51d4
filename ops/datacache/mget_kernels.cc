// CPU kernel of DatacacheMget (see mget_op.cc): one MGET on a pooled connection, each reply
// checked (length, header, sample index, CRC32) and its payload received straight into its row.
#include <isa-l/crc.h>  // Intel ISA-L: zlib's CRC32, ~10x faster (PCLMUL)

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/checks.h"
#include "datacache/redis_connection.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.h"

namespace tf_commlib {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;

constexpr long long kMaxValue = 512ll << 20;  // Redis' own limit on a string value

class DatacacheMgetOp : public OpKernel {
 public:
  explicit DatacacheMgetOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("address", &where_.address));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("username", &where_.username));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("db", &where_.db));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_ms", &where_.timeout_ms));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("connect_timeout_ms", &where_.connect_timeout_ms));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("prefix", &prefix_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtype", &dtype_));
    tensorflow::PartialTensorShape shape;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shape", &shape));
    OP_REQUIRES(ctx, shape.AsTensorShape(&shape_),
                errors::InvalidArgument("DatacacheMget: shape must be fully defined, got ", shape.DebugString()));
    OP_REQUIRES(ctx, where_.timeout_ms > 0,
                errors::InvalidArgument("DatacacheMget: timeout_ms must be > 0, got ", where_.timeout_ms));
    OP_REQUIRES(ctx, where_.connect_timeout_ms > 0,
                errors::InvalidArgument("DatacacheMget: connect_timeout_ms must be > 0, got ",
                                        where_.connect_timeout_ms));
    payload_ = static_cast<size_t>(shape_.num_elements()) * tensorflow::DataTypeSize(dtype_);
    header_ = prefix_.size() + 12;  // prefix, uint64 index, uint32 crc32
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor &keys = ctx->input(0), &indices = ctx->input(1);
    OP_REQUIRES_OK(ctx, TensorRank(keys, 1, "DatacacheMget", "keys"));
    OP_REQUIRES_OK(ctx, TensorRank(indices, 1, "DatacacheMget", "indices"));
    OP_REQUIRES_OK(ctx, TensorRank(ctx->input(2), 0, "DatacacheMget", "password"));
    OP_REQUIRES_OK(ctx, TensorRank(ctx->input(3), 0, "DatacacheMget", "enabled"));
    const int64_t n = keys.dim_size(0);
    OP_REQUIRES(ctx, indices.dim_size(0) == n,
                errors::InvalidArgument("DatacacheMget: indices has ", indices.dim_size(0),
                                        " entries but keys has ", n));
    TensorShape values_shape({n});
    values_shape.AppendShape(shape_);
    Tensor *values, *hit, *present, *ok, *error;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, values_shape, &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &hit));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &present));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({}), &ok));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({}), &error));
    auto hits = hit->vec<bool>();
    auto presents = present->vec<bool>();
    char* rows = static_cast<char*>(values->data());
    std::string message;
    bool fine = ctx->input(3).scalar<bool>()();
    if (!fine) {
      message = "disabled";
    } else if (n > 0) {
      const std::string& password = ctx->input(2).scalar<tensorflow::tstring>()();
      // A pooled connection may have died with a restarted server between two batches: the
      // batch is then tried once more on a fresh connection, and the pool is emptied. Not after
      // a timeout: a stalled server would make the batch wait twice.
      for (int attempt = 0; attempt < 2; ++attempt) {
        hits.setConstant(false);
        presents.setConstant(false);
        message.clear();
        bool reused = false;
        std::unique_ptr<RedisConnection> conn = Take(password, &reused, &message);
        fine = conn != nullptr && Fetch(conn.get(), keys.vec<tensorflow::tstring>(),
                                        indices.vec<int64_t>(), rows, &hits, &presents, &message);
        const bool stalled = conn != nullptr && conn->timed_out();
        if (fine) Give(std::move(conn));
        if (fine || !reused || stalled) break;
        Drain();
      }
    }
    if (!fine) {  // a reply that failed partway: no row of it counts
      hits.setConstant(false);
      presents.setConstant(false);
    }
    for (int64_t j = 0; j < n; ++j) {
      if (!hits(j)) std::memset(rows + j * payload_, 0, payload_);
    }
    ok->scalar<bool>()() = fine;
    error->scalar<tensorflow::tstring>()() = message;
  }

 private:
  template <typename Keys, typename Indices, typename Flags>
  bool Fetch(RedisConnection* conn, const Keys& keys, const Indices& indices, char* rows, Flags* hits,
             Flags* presents, std::string* error) {
    const int64_t n = keys.size();
    std::vector<std::string_view> args{"MGET"};
    for (int64_t j = 0; j < n; ++j) args.emplace_back(keys(j).data(), keys(j).size());
    if (!conn->Send(args, error)) return false;
    std::string line;
    if (!conn->ReadLine(&line, error)) return false;
    if (line != "*" + std::to_string(n)) {
      // An error reply (-NOPERM, ...) is quoted as ExpectOk quotes one: "<command> failed: -...".
      *error = (line.empty() || line[0] != '-' ? "MGET: unexpected reply " : "MGET failed: ") + line.substr(0, 200);
      return false;
    }
    std::vector<char> head(header_);
    for (int64_t j = 0; j < n; ++j) {
      if (!conn->ReadLine(&line, error)) return false;
      if (line.empty() || line[0] != '$') {
        *error = "MGET: unexpected reply element " + line.substr(0, 200);
        return false;
      }
      long long length = 0;
      const char* end = line.data() + line.size();
      const auto parsed = std::from_chars(line.data() + 1, end, length);
      if (parsed.ec != std::errc() || parsed.ptr != end || length < -1 || length > kMaxValue) {
        *error = "MGET: bad bulk length " + line.substr(0, 200);
        return false;
      }
      if (length == -1) continue;  // no such key
      (*presents)(j) = true;
      if (static_cast<size_t>(length) != header_ + payload_) {
        if (!conn->Read(nullptr, static_cast<size_t>(length) + 2, error)) return false;
        continue;
      }
      char* row = rows + j * payload_;
      if (!conn->Read(head.data(), header_, error) || !conn->Read(row, payload_, error) ||
          !conn->Read(nullptr, 2, error)) {
        return false;
      }
      uint64_t index;
      uint32_t crc;
      std::memcpy(&index, head.data() + prefix_.size(), 8);  // little endian, as x86 and ARM
      std::memcpy(&crc, head.data() + prefix_.size() + 8, 4);
      (*hits)(j) = std::memcmp(head.data(), prefix_.data(), prefix_.size()) == 0 &&
                   index == static_cast<uint64_t>(indices(j)) &&
                   crc32_gzip_refl(0, reinterpret_cast<const unsigned char*>(row), payload_) == crc;
    }
    return true;
  }

  // An idle pooled connection (*reused = true) or a new one; nullptr with *error set.
  std::unique_ptr<RedisConnection> Take(const std::string& password, bool* reused, std::string* error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!idle_.empty()) {
        std::unique_ptr<RedisConnection> c = std::move(idle_.back());
        idle_.pop_back();
        if (c->password() == password && c->Idle()) {
          *reused = true;
          return c;
        }
      }
    }
    *reused = false;
    RedisAddress where = where_;
    where.password = password;
    return RedisConnection::Open(where, error);
  }

  void Drain() {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.clear();
  }

  void Give(std::unique_ptr<RedisConnection> conn) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(std::move(conn));
  }

  RedisAddress where_;
  std::string prefix_;
  DataType dtype_;
  TensorShape shape_;
  size_t payload_ = 0, header_ = 0;
  std::mutex mu_;
  std::vector<std::unique_ptr<RedisConnection>> idle_;
};

REGISTER_KERNEL_BUILDER(Name("DatacacheMget").Device(tensorflow::DEVICE_CPU), DatacacheMgetOp);

}  // namespace tf_commlib
