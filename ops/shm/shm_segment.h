// Files in /dev/shm that the ranks of one node map together, and a barrier on them.
//
// Each collective op instance (a "key") owns one control segment (arrival tickets and per-rank
// lengths) and data segments named after their size. Every rank opens a segment before it arrives
// at the first barrier that uses it and unlinks it after that barrier, so nothing stays in
// /dev/shm once the ranks have mapped it (a crashed job leaves nothing behind either).
#ifndef TF_COMMLIB_SHM_SEGMENT_H_
#define TF_COMMLIB_SHM_SEGMENT_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "tensorflow/core/platform/status.h"

namespace tf_commlib {

constexpr int kMaxShmRanks = 64;

constexpr int64_t kFailed = -1;   // a rank's entry in `rows` when its call failed before the exchange

struct ShmControl {
  std::atomic<uint64_t> arrived[kMaxShmRanks];   // the last barrier ticket each rank reached
  std::atomic<int64_t> abandoned;                // set by a rank that timed out: the channel is dead
  // Per call parity (a rank may already be in the next call while others read these):
  int64_t rows[2][kMaxShmRanks];                 // each rank's rows (or length), or kFailed
  int64_t row_shape[2][kMaxShmRanks];            // a hash of the row shape and dtype (all-gather)
  int64_t mapped[2][kMaxShmRanks];               // 1 when the rank mapped the call's data segment
};

// The process-wide state of one key: its control segment and how many barriers/calls it has seen.
struct ShmChannel {
  std::mutex mu;                 // one call of a key at a time in this process
  ShmControl* control = nullptr;
  uint64_t ticket = 0;           // barriers passed (the same count on every rank)
  uint64_t calls = 0;
  uint64_t epoch = 0;            // data segment names carry it; a failed call starts a new one
  bool fresh = true;             // the control segment is still linked in /dev/shm
  tensorflow::Status broken;     // after a timeout every later call fails at once
};

// The channel of `name` (created on first use; lives as long as the process).
tensorflow::Status OpenChannel(const std::string& name, ShmChannel** out);

// /dev/shm/<name> of `bytes`, mapped; cached by name. *fresh is true on its first use here.
tensorflow::Status MapData(const std::string& name, size_t bytes, char** out, bool* fresh);

// Unmaps the data segments whose names start with `prefix`: after a call failed on some rank,
// every rank maps the next call's segments afresh (so no rank keeps an unlinked file others lost).
void ForgetData(const std::string& prefix);

void Unlink(const std::string& name);

// Arrives at the channel's next barrier and waits, up to timeout_s, for the other ranks of the set.
// A rank that times out marks the channel abandoned, so that a late rank fails instead of waiting.
tensorflow::Status Barrier(ShmChannel* ch, int rank, int size, double timeout_s, const char* op);

}  // namespace tf_commlib

#endif  // TF_COMMLIB_SHM_SEGMENT_H_
