#include "shm/shm_channel.h"

#include <sched.h>

#include <chrono>
#include <map>
#include <memory>
#include <thread>

#include "tensorflow/core/platform/errors.h"

namespace tf_commlib {

namespace errors = tensorflow::errors;
using tensorflow::Status;

namespace {

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Ranks share cores: yield at once, then sleep a little so waiting costs no CPU.
void Pause(int spin) {
  if (spin < 200) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(spin < 5000 ? 20 : 500));
  }
}

Status Abandoned(ShmChannel* ch, const ShmSet& set, int64_t why) {
  const char* tail = "; the shared-memory channel is closed";
  switch (why) {
    case kTimedOut:
      return errors::Aborted(set.op, ": another rank of the process set timed out waiting on this collective", tail);
    case kInvalid:
      return errors::DataLoss(set.op, ": another rank of the process set found an invalid value in the "
                              "shared-memory control segment", tail);
    case kCollision:
      return errors::AlreadyExists(set.op, ": rank 0 of the process set found the control segment's name in "
                                   "/dev/shm already taken", tail);
    default:
      return Invalid(ch, set, "closing reason " + std::to_string(why));
  }
}

bool AllArrived(const ShmControl* c, const ShmSet& set, uint64_t ticket) {
  for (int j = 0; j < set.size; ++j) {
    if (c->arrived[j].load(std::memory_order_acquire) < ticket) return false;
  }
  return true;
}

bool Same(const uint64_t a[2], const uint64_t b[2]) { return a[0] == b[0] && a[1] == b[1]; }

}  // namespace

ShmChannel* GetChannel(const std::string& name) {
  static std::mutex mu;
  static auto* channels = new std::map<std::string, std::unique_ptr<ShmChannel>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*channels)[name];
  if (!slot) {
    slot = std::make_unique<ShmChannel>();
    slot->name = name;
  }
  return slot.get();
}

Status OpenControl(ShmChannel* ch, const ShmSet& set) {
  Segment segment;
  if (set.rank == 0) {
    Status st = CreateSegment(ch->name, sizeof(ShmControl), /*atomically=*/true, &segment);
    if (errors::IsAlreadyExists(st) && OpenSegment(ch->name, sizeof(ShmControl), true, &segment).ok()) {
      // ours (same uid, private) yet not made here: tell the ranks that opened it
      reinterpret_cast<ShmControl*>(segment.base)->abandoned.store(kCollision, std::memory_order_release);
      Unmap(&segment);
    }
    TF_RETURN_IF_ERROR(st);
    ch->control_linked = true;
  } else {
    const auto start = std::chrono::steady_clock::now();
    for (int spin = 0;; ++spin) {
      Status st = OpenSegment(ch->name, sizeof(ShmControl), true, &segment);
      if (!errors::IsNotFound(st)) TF_RETURN_IF_ERROR(st);
      if (st.ok()) break;
      if (Since(start) > set.timeout) {
        return errors::DeadlineExceeded(set.op, ": rank 0 of the process set did not create this collective's "
                                        "shared-memory segment within ", set.timeout, " s (TF_COMMLIB_SHM_TIMEOUT); "
                                        "every rank of the set must run the same collectives in the same order");
      }
      Pause(spin);
    }
  }
  ch->control = reinterpret_cast<ShmControl*>(segment.base);
  return tensorflow::OkStatus();
}

Status Barrier(ShmChannel* ch, const ShmSet& set) {
  ShmControl* c = ch->control;
  const uint64_t ticket = ++ch->ticket;
  c->arrived[set.rank].store(ticket, std::memory_order_release);
  const auto start = std::chrono::steady_clock::now();
  Status st;
  for (int spin = 0; st.ok(); ++spin) {
    const int64_t why = c->abandoned.load(std::memory_order_acquire);
    if (why != 0) {
      st = Abandoned(ch, set, why);
      break;
    }
    int missing = -1;
    for (int j = 0; j < set.size && st.ok(); ++j) {
      // a rank is at most one barrier behind or ahead of this one
      const uint64_t seen = c->arrived[j].load(std::memory_order_acquire);
      if (seen + 1 < ticket || seen > ticket + 1) {
        st = Invalid(ch, set, "arrival ticket " + std::to_string(seen) + " of rank " + std::to_string(j) +
                                  " at barrier " + std::to_string(ticket));
      } else if (seen < ticket && missing < 0) {
        missing = j;
      }
    }
    if (!st.ok() || missing < 0) break;
    Pause(spin);
    if (spin >= 200 && Since(start) > set.timeout) {
      c->abandoned.store(kTimedOut, std::memory_order_release);
      st = errors::DeadlineExceeded(set.op, ": rank ", missing, " of the process set did not arrive within ",
                                    set.timeout, " s (TF_COMMLIB_SHM_TIMEOUT); every rank of the set must run "
                                    "the same collectives in the same order");
    }
  }
  if (ch->control_linked) {   // the first barrier: once every rank has mapped the control segment
    // after a failure other than a timeout, a late rank must still find it and read why it closed
    for (int spin = 0; !st.ok() && !errors::IsDeadlineExceeded(st) && !AllArrived(c, set, ticket) &&
                       Since(start) <= set.timeout; ++spin) {
      Pause(spin);
    }
    Unlink(ch->name);
    ch->control_linked = false;
  }
  return st;
}

Status Invalid(ShmChannel* ch, const ShmSet& set, const std::string& what) {
  ch->control->abandoned.store(kInvalid, std::memory_order_release);
  return errors::DataLoss(set.op, ": the shared-memory control segment holds an invalid value (", what,
                          "); the channel is closed");
}

Status ReadEntries(ShmChannel* ch, const ShmSet& set, int parity, std::vector<ShmEntry>* out) {
  out->assign(ch->control->entry[parity], ch->control->entry[parity] + set.size);
  for (int j = 0; j < set.size; ++j) {
    const ShmEntry& e = (*out)[j];
    if (e.rows == kFailed) continue;
    const bool valid = e.rows >= 0 && e.rows <= kMaxBytes && e.row_bytes >= 0 && e.row_bytes <= kMaxBytes &&
                       (e.fresh == 0 || e.fresh == 1) && (e.mapped == 0 || e.mapped == 1) &&
                       e.capacity >= static_cast<int64_t>(kMinCapacity) && e.capacity <= kMaxBytes &&
                       (e.capacity & (e.capacity - 1)) == 0 && (e.token[0] | e.token[1]) != 0;
    if (!valid) {
      return Invalid(ch, set, "entry of rank " + std::to_string(j) + ": rows " + std::to_string(e.rows) +
                                  ", row bytes " + std::to_string(e.row_bytes) + ", fresh " + std::to_string(e.fresh) +
                                  ", mapped " + std::to_string(e.mapped) + ", capacity " + std::to_string(e.capacity));
    }
  }
  return tensorflow::OkStatus();
}

Status EnsureOwn(ShmChannel* ch, size_t bytes) {
  ch->own_fresh = false;
  if (ch->own.segment.base && ch->own.segment.bytes >= bytes) return tensorflow::OkStatus();
  if (bytes > static_cast<size_t>(kMaxBytes)) {
    return errors::InvalidArgument("shared memory: ", bytes, " bytes is more than a data segment may hold");
  }
  size_t capacity = kMinCapacity;
  while (capacity < bytes) capacity *= 2;
  DataSegment fresh;
  std::string name;
  TF_RETURN_IF_ERROR(RandomName(&name, fresh.token));
  TF_RETURN_IF_ERROR(CreateSegment(name, capacity, /*atomically=*/false, &fresh.segment));
  fresh.linked = true;
  UnlinkOwn(ch);
  Unmap(&ch->own.segment);
  ch->own = fresh;
  ch->own_fresh = true;
  return tensorflow::OkStatus();
}

void Publish(ShmChannel* ch, const ShmSet& set, int parity, int64_t rows, int64_t row_shape, int64_t row_bytes) {
  ShmEntry& e = ch->control->entry[parity][set.rank];
  e.rows = rows;
  e.row_shape = row_shape;
  e.row_bytes = row_bytes;
  e.fresh = ch->own_fresh;
  e.mapped = 0;
  e.capacity = static_cast<int64_t>(ch->own.segment.bytes);
  e.token[0] = ch->own.token[0];
  e.token[1] = ch->own.token[1];
}

Status MapPeers(ShmChannel* ch, const ShmSet& set, const std::vector<ShmEntry>& entries, bool* any_fresh,
                Status* mapped) {
  *any_fresh = false;
  *mapped = tensorflow::OkStatus();
  for (int j = 0; j < set.size; ++j) {
    const ShmEntry& e = entries[j];
    *any_fresh = *any_fresh || e.fresh;
    DataSegment& d = ch->peer[j];
    if (j == set.rank || (d.segment.base && Same(d.token, e.token))) continue;
    if (!e.fresh) return Invalid(ch, set, "rank " + std::to_string(j) + "'s data segment changed unannounced");
    Unmap(&d.segment);
    d.token[0] = d.token[1] = 0;
    if (mapped->ok()) *mapped = OpenSegment(NameOf(e.token), e.capacity, /*writable=*/false, &d.segment);
    if (d.segment.base) {
      d.token[0] = e.token[0];
      d.token[1] = e.token[1];
    }
  }
  return tensorflow::OkStatus();
}

void UnlinkOwn(ShmChannel* ch) {
  if (ch->own.linked) Unlink(NameOf(ch->own.token));
  ch->own.linked = false;
}

void DropFresh(ShmChannel* ch) {
  if (!ch->own_fresh) return;
  UnlinkOwn(ch);
  Unmap(&ch->own.segment);
  ch->own = DataSegment();
  ch->own_fresh = false;
}

void Close(ShmChannel* ch) {
  if (ch->control_linked) Unlink(ch->name);
  ch->control_linked = false;
  UnlinkOwn(ch);
}

}  // namespace tf_commlib
