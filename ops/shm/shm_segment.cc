#include "shm/shm_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tensorflow/core/platform/errors.h"

namespace tf_commlib {

namespace errors = tensorflow::errors;
using tensorflow::Status;

namespace {

std::string PathOf(const std::string& name) { return "/dev/shm/" + name; }

// The names this process created and has not unlinked yet, readable from a signal handler: a slot
// is taken (1), filled, then published (2); the handler unlinks the published ones.
constexpr int kPendingSlots = 4096;
constexpr size_t kPathBytes = 80;
struct Pending {
  std::atomic<int> state{0};
  char path[kPathBytes];
};
Pending pending[kPendingSlots];

void UnlinkPending() {
  for (Pending& p : pending) {
    if (p.state.load(std::memory_order_acquire) == 2) unlink(p.path);
  }
}

void OnSignal(int sig) {
  UnlinkPending();
  signal(sig, SIG_DFL);   // then die of the signal, as without this handler
  raise(sig);
}

// Once: unlink what is pending at exit, and on SIGTERM (horovodrun's way of stopping the other
// ranks when one failed) and SIGHUP where nothing else handles them.
void InstallCleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit(UnlinkPending);
    for (int sig : {SIGTERM, SIGHUP}) {
      struct sigaction old;
      if (sigaction(sig, nullptr, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL) {
        struct sigaction act = {};
        act.sa_handler = OnSignal;
        sigemptyset(&act.sa_mask);
        sigaction(sig, &act, nullptr);
      }
    }
  });
}

void AddPending(const std::string& path) {
  InstallCleanup();
  if (path.size() >= kPathBytes) return;
  for (Pending& p : pending) {
    int free = 0;
    if (p.state.compare_exchange_strong(free, 1, std::memory_order_acq_rel)) {
      std::memcpy(p.path, path.c_str(), path.size() + 1);
      p.state.store(2, std::memory_order_release);
      return;
    }
  }   // all slots taken: the name is still unlinked by Unlink, only not on a signal
}

void DropPending(const std::string& path) {
  for (Pending& p : pending) {
    int published = 2;
    if (p.state.load(std::memory_order_acquire) == 2 && path == p.path &&
        p.state.compare_exchange_strong(published, 1, std::memory_order_acq_rel)) {
      p.state.store(0, std::memory_order_release);
      return;
    }
  }
}

Status Refuse(const std::string& path, const std::string& why) {
  return errors::PermissionDenied("shared memory: refusing ", path, ": ", why,
                                  "; another user may have created it (TF_COMMLIB_SHM=0 turns shared memory off)");
}

Status MapFd(int fd, const std::string& path, size_t bytes, bool writable, Segment* out) {
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return errors::ResourceExhausted("shared memory: cannot map ", path, ": ", strerror(errno));
  out->base = static_cast<char*>(p);
  out->bytes = bytes;
  return tensorflow::OkStatus();
}

}  // namespace

Status RandomName(std::string* name, uint64_t token[2]) {
  char* bytes = reinterpret_cast<char*>(token);
  for (size_t got = 0; got < 2 * sizeof(uint64_t);) {
    ssize_t n = getrandom(bytes + got, 2 * sizeof(uint64_t) - got, 0);
    if (n < 0 && errno != EINTR) return errors::Unavailable("shared memory: getrandom: ", strerror(errno));
    if (n > 0) got += n;
  }
  *name = NameOf(token);
  return tensorflow::OkStatus();
}

// "tfcl_" and the launcher's per-job tag (TF_COMMLIB_SHM_TAG: letters and digits, at most 24, as
// tf_commlib/shm.py checks), so that a launcher can remove what killed ranks left behind.
static std::string NamePrefix() {
  const char* tag = getenv("TF_COMMLIB_SHM_TAG");
  std::string t = tag ? tag : "";
  bool ok = t.size() <= 24;
  for (char ch : t) ok = ok && isalnum(static_cast<unsigned char>(ch));
  return (ok && !t.empty()) ? "tfcl_" + t + "_" : "tfcl_";
}

std::string NameOf(const uint64_t token[2]) {
  char text[40];
  snprintf(text, sizeof(text), "%016llx%016llx", static_cast<unsigned long long>(token[0]),
           static_cast<unsigned long long>(token[1]));
  return NamePrefix() + text;
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 63 || name[0] == '.') return false;
  for (char ch : name) {
    if (!(isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.')) return false;
  }
  return true;
}

Status CreateSegment(const std::string& name, size_t bytes, bool atomically, Segment* out) {
  const std::string path = PathOf(name);
  std::string tmp = path;
  if (atomically) {
    uint64_t token[2];
    TF_RETURN_IF_ERROR(RandomName(&tmp, token));
    tmp = PathOf(tmp);
  }
  int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    return errors::AlreadyExists("shared memory: ", tmp, " already exists, created by someone else; refusing "
                                 "to use it (TF_COMMLIB_SHM=0 turns shared memory off)");
  }
  if (fd < 0) return errors::Unavailable("shared memory: cannot create ", tmp, ": ", strerror(errno));
  AddPending(tmp);
  Status st = tensorflow::OkStatus();
  int rc = fchmod(fd, 0600);   // whatever the umask
  if (rc == 0) rc = posix_fallocate(fd, 0, bytes);
  else rc = errno;
  if (rc != 0) {
    st = errors::ResourceExhausted("shared memory: cannot reserve ", bytes, " bytes for ", tmp, ": ",
                                   strerror(rc), " (is /dev/shm large enough? TF_COMMLIB_SHM=0 turns "
                                   "shared memory off)");
  }
  if (st.ok()) st = MapFd(fd, tmp, bytes, true, out);
  close(fd);
  if (st.ok() && atomically) {
    AddPending(path);
    if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) {
      DropPending(tmp);
      return st;
    }
    st = errno == EEXIST
        ? errors::AlreadyExists("shared memory: ", path, " already exists, created by someone else; refusing "
                                "to use it (TF_COMMLIB_SHM=0 turns shared memory off)")
        : errors::Unavailable("shared memory: cannot rename ", tmp, " to ", path, ": ", strerror(errno));
    DropPending(path);
  }
  if (!st.ok()) {
    Unmap(out);
    unlink(tmp.c_str());
    DropPending(tmp);
  }
  return st;
}

Status OpenSegment(const std::string& name, size_t bytes, bool writable, Segment* out) {
  const std::string path = PathOf(name);
  // O_NONBLOCK: a FIFO at the name must not block this open (fstat then refuses it)
  int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return errors::NotFound("shared memory: ", path, " does not exist");
    if (errno == ELOOP) return Refuse(path, "it is a symbolic link");
    return Refuse(path, std::string("cannot open it: ") + strerror(errno));
  }
  struct stat st;
  Status status = tensorflow::OkStatus();
  if (fstat(fd, &st) != 0) {
    status = Refuse(path, std::string("cannot stat it: ") + strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    status = Refuse(path, "it is not a regular file");
  } else if (st.st_uid != geteuid()) {
    status = Refuse(path, "it is owned by uid " + std::to_string(st.st_uid) + ", not by this process's uid " +
                              std::to_string(geteuid()));
  } else if (st.st_mode & 077) {
    char mode[8];
    snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    status = Refuse(path, std::string("its mode ") + mode + " lets other users open it (expected 0600)");
  } else if (st.st_nlink != 1) {
    status = Refuse(path, "it has " + std::to_string(st.st_nlink) + " links");
  } else if (static_cast<uint64_t>(st.st_size) != bytes) {
    status = Refuse(path, "it is " + std::to_string(st.st_size) + " bytes, expected " + std::to_string(bytes));
  }
  if (status.ok()) status = MapFd(fd, path, bytes, writable, out);
  close(fd);
  return status;
}

void Unmap(Segment* segment) {
  if (segment->base) munmap(segment->base, segment->bytes);
  *segment = Segment();
}

void Unlink(const std::string& name) {
  const std::string path = PathOf(name);
  unlink(path.c_str());
  DropPending(path);
}

}  // namespace tf_commlib
