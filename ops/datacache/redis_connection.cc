// See redis_connection.h.
#include "datacache/redis_connection.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tf_commlib {
namespace {

// SO_RCVTIMEO / SO_SNDTIMEO expired (connect() then fails with EINPROGRESS).
bool TimedOut(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == EINPROGRESS; }

std::string Errno(const char* what) {
  return std::string(what) + ": " + (TimedOut(errno) ? "timed out" : std::strerror(errno));
}

int ConnectUnix(const std::string& path, const timeval& tv, std::string* error) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    *error = "unix socket path too long: " + path;
    return -1;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = Errno("socket");
    return -1;
  }
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    *error = Errno(("connect " + path).c_str());
    close(fd);
    return -1;
  }
  return fd;
}

int ConnectTcp(const std::string& hostport, const timeval& tv, std::string* error) {
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) {
    *error = "address tcp:" + hostport + " has no port";
    return -1;
  }
  std::string host = hostport.substr(0, colon), port = hostport.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{}, *found = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    *error = "getaddrinfo " + hostport + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  std::string last = "getaddrinfo " + hostport + ": no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = Errno("socket");
      continue;
    }
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));  // also bounds connect() on Linux
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      last = Errno(("connect " + hostport).c_str());
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) *error = last;
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

}  // namespace

std::unique_ptr<RedisConnection> RedisConnection::Open(const RedisAddress& where, std::string* error) {
  const timeval tv{where.timeout_ms / 1000, (where.timeout_ms % 1000) * 1000};
  const timeval connect_tv{where.connect_timeout_ms / 1000, (where.connect_timeout_ms % 1000) * 1000};
  int fd = -1;
  if (where.address.rfind("unix:", 0) == 0) {
    fd = ConnectUnix(where.address.substr(5), connect_tv, error);
  } else if (where.address.rfind("tcp:", 0) == 0) {
    fd = ConnectTcp(where.address.substr(4), connect_tv, error);
  } else {
    *error = "address must start with unix: or tcp:, got " + where.address;
  }
  if (fd < 0) return nullptr;
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::unique_ptr<RedisConnection> c(new RedisConnection(fd));
  c->password_ = where.password;
  c->timeout_ = c->recv_timeout_ = std::chrono::milliseconds(where.timeout_ms);
  if (!where.password.empty()) {
    std::vector<std::string_view> auth{"AUTH"};
    if (!where.username.empty()) auth.push_back(where.username);
    auth.push_back(where.password);
    if (!c->Send(auth, error) || !c->ExpectOk("AUTH", error)) return nullptr;
  }
  if (where.db != 0) {
    const std::string db = std::to_string(where.db);
    if (!c->Send({"SELECT", db}, error) || !c->ExpectOk("SELECT", error)) return nullptr;
  }
  return c;
}

RedisConnection::~RedisConnection() { close(fd_); }

bool RedisConnection::Failed(const char* what, std::string* error) {
  timed_out_ = TimedOut(errno);
  *error = Errno(what);
  return false;
}

bool RedisConnection::Overdue(std::string* error) {
  if (std::chrono::steady_clock::now() <= deadline_) return false;
  timed_out_ = true;
  *error = "recv: timed out (the reply took longer than timeout_ms)";
  return true;
}

bool RedisConnection::Bound(std::string* error) {
  using std::chrono::milliseconds;
  if (Overdue(error)) return false;
  // At least 1 ms: an SO_RCVTIMEO of 0 would wait forever.
  const milliseconds left = std::max(
      milliseconds(1), std::chrono::ceil<milliseconds>(deadline_ - std::chrono::steady_clock::now()));
  // A blocking recv waits up to SO_RCVTIMEO: lowered to the time left (when that is shorter by more
  // than an eighth of timeout_ms, so a fast reply costs no extra system calls) so that a recv
  // started just before the deadline cannot outlast it by up to a whole timeout_ms.
  if (recv_timeout_ - left > timeout_ / 8) SetRecvTimeout(left);
  return true;
}

void RedisConnection::SetRecvTimeout(std::chrono::milliseconds t) {
  const timeval tv{static_cast<time_t>(t.count() / 1000), static_cast<suseconds_t>((t.count() % 1000) * 1000)};
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  recv_timeout_ = t;
}

bool RedisConnection::Idle() const {
  if (begin_ != end_) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) == 0;
}

bool RedisConnection::Send(const std::vector<std::string_view>& args, std::string* error) {
  deadline_ = std::chrono::steady_clock::now() + timeout_;
  if (recv_timeout_ != timeout_) SetRecvTimeout(timeout_);
  std::string out = "*" + std::to_string(args.size()) + "\r\n";
  for (std::string_view a : args) {
    out += "$" + std::to_string(a.size()) + "\r\n";
    out.append(a.data(), a.size());
    out += "\r\n";
  }
  for (size_t sent = 0; sent < out.size();) {
    ssize_t n = send(fd_, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Failed("send", error);
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool RedisConnection::Fill(std::string* error) {
  if (begin_ == end_) begin_ = end_ = 0;
  if (end_ == buf_.size()) {  // compact (a line longer than the buffer grows it)
    if (begin_ > 0) {
      std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    } else {
      buf_.resize(buf_.size() * 2);
    }
  }
  for (;;) {
    if (!Bound(error)) return false;
    ssize_t n = recv(fd_, buf_.data() + end_, buf_.size() - end_, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Failed("recv", error);
    if (n == 0) {
      *error = "recv: the server closed the connection";
      return false;
    }
    end_ += static_cast<size_t>(n);
    return true;
  }
}

bool RedisConnection::ReadLine(std::string* line, std::string* error) {
  size_t scanned = begin_;
  for (;;) {
    for (size_t i = scanned; i + 1 < end_; ++i) {
      if (buf_[i] == '\r' && buf_[i + 1] == '\n') {
        line->assign(buf_.data() + begin_, i - begin_);
        begin_ = i + 2;
        return true;
      }
    }
    if (end_ - begin_ > (1u << 20)) {
      *error = "reply line longer than 1 MiB";
      return false;
    }
    const size_t offset = end_ > begin_ ? end_ - begin_ - 1 : 0;  // rescan the last byte ('\r')
    if (!Fill(error)) return false;
    scanned = begin_ + offset;
  }
}

bool RedisConnection::Read(char* dst, size_t n, std::string* error) {
  const size_t buffered = std::min(n, end_ - begin_);
  if (dst != nullptr) std::memcpy(dst, buf_.data() + begin_, buffered);
  begin_ += buffered;
  size_t done = buffered;
  while (done < n) {
    const size_t want = n - done;
    if (dst != nullptr && want >= buf_.size() / 2) {  // large: straight into the destination
      if (!Bound(error)) return false;
      ssize_t got = recv(fd_, dst + done, want, MSG_WAITALL);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return Failed("recv", error);
      if (got == 0) {
        *error = "recv: the server closed the connection";
        return false;
      }
      done += static_cast<size_t>(got);
      continue;
    }
    if (!Fill(error)) return false;
    const size_t take = std::min(want, end_ - begin_);
    if (dst != nullptr) std::memcpy(dst + done, buf_.data() + begin_, take);
    begin_ += take;
    done += take;
  }
  return true;
}

bool RedisConnection::ExpectOk(const char* what, std::string* error) {
  std::string line;
  if (!ReadLine(&line, error)) return false;
  if (line != "+OK") {
    *error = std::string(what) + " failed: " + line;
    return false;
  }
  return true;
}

}  // namespace tf_commlib
