// Files in /dev/shm that the ranks of one machine map together, safe from the machine's other users.
//
// A segment is created by one rank only, exclusively (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600); the
// other ranks open it with O_NOFOLLOW and refuse it unless fstat shows a regular file with one
// link, owned by their own uid, that no group or other user may open, of the expected size. So a
// name that someone else created first (a file, a symbolic link, a FIFO) is an error, never used.
// Names are unguessable: a control segment's is an HMAC of a secret the ranks of the set share
// through Horovod (tf_commlib/shm.py), a data segment's is random and travels through the control
// segment. A name stays in /dev/shm only until the ranks that need it have opened it; the names this
// process created and has not unlinked yet are unlinked on a failure, at exit and on SIGTERM/SIGHUP
// (when those have no other handler; the process then dies of the signal as before).
#ifndef TF_COMMLIB_SHM_SEGMENT_H_
#define TF_COMMLIB_SHM_SEGMENT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "tensorflow/core/platform/status.h"

namespace tf_commlib {

struct Segment {
  char* base = nullptr;
  size_t bytes = 0;
};

// A random segment name ("tfcl_" and 32 hex digits) and the 128 bits it spells.
tensorflow::Status RandomName(std::string* name, uint64_t token[2]);
std::string NameOf(const uint64_t token[2]);

// True for a name this library may put under /dev/shm: 1 to 63 of [A-Za-z0-9_.-], not starting with '.'.
bool ValidName(const std::string& name);

// Creates /dev/shm/<name> exclusively with `bytes` reserved (a full /dev/shm is an error here, not
// a SIGBUS later) and maps it read-write. With `atomically`, the file is prepared under a random
// name and renamed to <name> (never replacing anything), so whoever opens <name> finds it complete.
// AlreadyExists when <name> exists. The name stays linked until Unlink(name).
tensorflow::Status CreateSegment(const std::string& name, size_t bytes, bool atomically, Segment* out);

// Opens and maps /dev/shm/<name>, made by another rank of the set, after the checks above; NotFound
// while it does not exist yet, PermissionDenied for a file this process must not trust.
tensorflow::Status OpenSegment(const std::string& name, size_t bytes, bool writable, Segment* out);

void Unmap(Segment* segment);

// Unlinks a name this process created.
void Unlink(const std::string& name);

}  // namespace tf_commlib

#endif  // TF_COMMLIB_SHM_SEGMENT_H_
