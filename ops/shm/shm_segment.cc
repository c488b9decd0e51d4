#include "shm/shm_segment.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "tensorflow/core/platform/errors.h"

namespace tf_commlib {

namespace errors = tensorflow::errors;
using tensorflow::Status;

namespace {

std::mutex registry_mu;

std::string PathOf(const std::string& name) { return "/dev/shm/" + name; }

Status Map(const std::string& name, size_t bytes, char** out) {
  const std::string path = PathOf(name);
  int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return errors::Unavailable("shared memory: cannot open ", path, ": ", strerror(errno));
  // Reserve the memory now: a full /dev/shm is an error here, not a SIGBUS at the first write.
  // Every rank asks for the same size (the name encodes it), so this is idempotent.
  int rc = posix_fallocate(fd, 0, bytes);
  if (rc != 0) {
    close(fd);
    return errors::ResourceExhausted("shared memory: cannot reserve ", bytes, " bytes for ", path, ": ",
                                     strerror(rc), " (is /dev/shm large enough? TF_COMMLIB_SHM=0 turns "
                                     "shared memory off)");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return errors::ResourceExhausted("shared memory: cannot map ", path, ": ", strerror(errno));
  *out = static_cast<char*>(p);
  return tensorflow::OkStatus();
}

}  // namespace

Status OpenChannel(const std::string& name, ShmChannel** out) {
  static auto* channels = new std::map<std::string, std::unique_ptr<ShmChannel>>();
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& slot = (*channels)[name];
  if (!slot) {
    auto ch = std::make_unique<ShmChannel>();
    char* base = nullptr;
    TF_RETURN_IF_ERROR(Map(name, sizeof(ShmControl), &base));
    ch->control = reinterpret_cast<ShmControl*>(base);
    slot = std::move(ch);
  }
  *out = slot.get();
  return tensorflow::OkStatus();
}

std::map<std::string, std::pair<char*, size_t>>& DataMaps() {
  static auto* maps = new std::map<std::string, std::pair<char*, size_t>>();
  return *maps;
}

Status MapData(const std::string& name, size_t bytes, char** out, bool* fresh) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = DataMaps().find(name);
  *fresh = it == DataMaps().end();
  if (*fresh) {
    TF_RETURN_IF_ERROR(Map(name, bytes, out));
    DataMaps()[name] = {*out, bytes};
  } else {
    *out = it->second.first;
  }
  return tensorflow::OkStatus();
}

void ForgetData(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& maps = DataMaps();
  for (auto it = maps.lower_bound(prefix); it != maps.end() && it->first.rfind(prefix, 0) == 0;) {
    munmap(it->second.first, it->second.second);
    it = maps.erase(it);
  }
}

void Unlink(const std::string& name) { unlink(PathOf(name).c_str()); }

Status Barrier(ShmChannel* ch, int rank, int size, double timeout_s, const char* op) {
  ShmControl* c = ch->control;
  const uint64_t ticket = ++ch->ticket;
  c->arrived[rank].store(ticket, std::memory_order_release);
  const auto start = std::chrono::steady_clock::now();
  for (int spin = 0;; ++spin) {
    if (c->abandoned.load(std::memory_order_acquire)) {
      return errors::Aborted(op, ": another rank of the process set timed out waiting on this "
                             "collective; the shared-memory channel is closed");
    }
    int missing = -1;
    for (int j = 0; j < size && missing < 0; ++j) {
      if (c->arrived[j].load(std::memory_order_acquire) < ticket) missing = j;
    }
    if (missing < 0) return tensorflow::OkStatus();
    // Ranks share cores: yield at once, then sleep a little so waiting costs no CPU.
    if (spin < 200) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(spin < 5000 ? 20 : 500));
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s) {
        c->abandoned.store(1, std::memory_order_release);
        return errors::DeadlineExceeded(op, ": rank ", missing, " of the process set did not arrive within ",
                                        timeout_s, " s (TF_COMMLIB_SHM_TIMEOUT); every rank of the set must "
                                        "run the same collectives in the same order");
      }
    }
  }
}

}  // namespace tf_commlib
