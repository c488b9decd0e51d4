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

struct ShmControl {
  std::atomic<uint64_t> arrived[kMaxShmRanks];   // the last barrier ticket each rank reached
  int64_t rows[2][kMaxShmRanks];                 // per call parity: each rank's row count
  int64_t row_bytes[2][kMaxShmRanks];            // and bytes per row
  int64_t dtype[2][kMaxShmRanks];                // and the TF dtype enum
};

// The process-wide state of one key: its control segment and how many barriers/calls it has seen.
struct ShmChannel {
  std::mutex mu;                 // one call of a key at a time in this process
  ShmControl* control = nullptr;
  uint64_t ticket = 0;           // barriers passed (the same count on every rank)
  uint64_t calls = 0;
  bool fresh = true;             // the control segment is still linked in /dev/shm
};

// The channel of `name` (created on first use; lives as long as the process).
tensorflow::Status OpenChannel(const std::string& name, ShmChannel** out);

// /dev/shm/<name> of `bytes`, mapped; cached by name. *fresh is true on its first use here.
tensorflow::Status MapData(const std::string& name, size_t bytes, char** out, bool* fresh);

// Unmaps a data segment: after ranks disagreed on a call, each maps the next one afresh.
void ForgetData(const std::string& name);

void Unlink(const std::string& name);

// Arrives at the channel's next barrier and waits, up to timeout_s, for the other ranks of the set.
tensorflow::Status Barrier(ShmChannel* ch, int rank, int size, double timeout_s, const char* op);

}  // namespace tf_commlib

#endif  // TF_COMMLIB_SHM_SEGMENT_H_
