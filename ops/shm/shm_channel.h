// The channel of one collective op instance (a "key") among the ranks of a set on one machine: a
// control segment (arrival tickets and what each rank publishes about a call) and one data segment
// per rank, which only that rank writes.
//
// Rank 0 of the set creates the control segment under the name the op was given (an HMAC of the
// set's secret); the others wait for it to appear and open it; rank 0 unlinks it after the first
// barrier, where every rank has mapped it (after a failure there, once every rank has arrived or
// the timeout passed, so that a late rank reads why the channel closed instead of waiting for it).
// A rank creates its data segment under a random name and publishes the name in the control
// segment; the others open it (read-only) after that barrier and its creator unlinks it after the
// next one. Every value read from the control segment is checked before use: an invalid one closes
// the channel with an error on every rank.
#ifndef TF_COMMLIB_SHM_CHANNEL_H_
#define TF_COMMLIB_SHM_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "shm/shm_segment.h"
#include "tensorflow/core/platform/status.h"

namespace tf_commlib {

constexpr int kMaxShmRanks = 64;
constexpr int64_t kFailed = -1;            // `rows` of a rank whose call failed before the exchange
constexpr int64_t kMaxBytes = 1ll << 48;   // larger counts or sizes in the control segment are invalid
constexpr size_t kMinCapacity = 4096;      // data segments are powers of two from here

// Why a channel was closed (ShmControl::abandoned); 0 while it is open.
enum : int64_t { kTimedOut = 1, kInvalid = 2, kCollision = 3 };

// What rank r publishes about call c in entry[c & 1][r] before the call's first barrier (a rank may
// already be in call c + 1 while the others read call c's entries, never in c + 2).
struct ShmEntry {
  int64_t rows;         // reduce-scatter: the length; all-gather: the rows; or kFailed
  int64_t row_shape;    // all-gather: a hash of the dtype and row shape
  int64_t row_bytes;    // all-gather: bytes per row
  int64_t fresh;        // 1 when the data segment below was created in this call
  int64_t mapped;       // after the first barrier: 1 when this rank mapped every fresh data segment
  int64_t capacity;     // bytes of this rank's data segment
  uint64_t token[2];    // its name (NameOf)
};

struct ShmControl {
  std::atomic<uint64_t> arrived[kMaxShmRanks];   // the last barrier ticket each rank reached
  std::atomic<int64_t> abandoned;                // 0, or why the channel is closed
  ShmEntry entry[2][kMaxShmRanks];
};

struct DataSegment {
  uint64_t token[2] = {0, 0};
  Segment segment;
  bool linked = false;   // created here and still in /dev/shm
};

// A collective's view of the process set.
struct ShmSet {
  int rank, size;
  double timeout;
  const char* op;
};

// The process-wide state of one key (it lives as long as the process).
struct ShmChannel {
  std::mutex mu;                   // one call of a key at a time in this process
  std::string name;
  ShmControl* control = nullptr;   // mapped by OpenControl
  bool control_linked = false;     // rank 0: its control segment is still in /dev/shm
  uint64_t ticket = 0;             // barriers passed (the same count on every rank)
  uint64_t calls = 0;
  tensorflow::Status broken;       // after a timeout or an invalid value every later call fails at once
  DataSegment own;
  bool own_fresh = false;          // `own` was created in the current call
  DataSegment peer[kMaxShmRanks];  // the other ranks' data segments, read-only
};

// The channel of `name` (created empty on first use).
ShmChannel* GetChannel(const std::string& name);

// Maps the channel's control segment: rank 0 creates it, the others wait up to the timeout for it.
tensorflow::Status OpenControl(ShmChannel* ch, const ShmSet& set);

// Arrives at the channel's next barrier and waits, up to the timeout, for the other ranks. A rank
// that times out closes the channel, so that a late rank fails instead of waiting.
tensorflow::Status Barrier(ShmChannel* ch, const ShmSet& set);

// Closes the channel on every rank (they fail at their next barrier) and returns the error.
tensorflow::Status Invalid(ShmChannel* ch, const ShmSet& set, const std::string& what);

// Copies the parity's entries of every rank and checks their ranges.
tensorflow::Status ReadEntries(ShmChannel* ch, const ShmSet& set, int parity, std::vector<ShmEntry>* out);

// This rank's data segment, at least `bytes` long: the current one, or a new one (own_fresh).
tensorflow::Status EnsureOwn(ShmChannel* ch, size_t bytes);

// Publishes this rank's entry for the call: rows (or kFailed) and its data segment.
void Publish(ShmChannel* ch, const ShmSet& set, int parity, int64_t rows, int64_t row_shape, int64_t row_bytes);

// Maps the other ranks' data segments that are new in this call (an unannounced new one is
// invalid); *mapped is this rank's result, for the others to see. *any_fresh: some rank has a new one.
tensorflow::Status MapPeers(ShmChannel* ch, const ShmSet& set, const std::vector<ShmEntry>& entries,
                            bool* any_fresh, tensorflow::Status* mapped);

// After the barrier that follows MapPeers: this rank's new data segment leaves /dev/shm.
void UnlinkOwn(ShmChannel* ch);

// After a failed call: this rank's data segment, if created in the call, is unlinked and dropped.
void DropFresh(ShmChannel* ch);

// After a timeout: whatever this rank still has in /dev/shm for the channel is unlinked.
void Close(ShmChannel* ch);

}  // namespace tf_commlib

#endif  // TF_COMMLIB_SHM_CHANNEL_H_
