// A minimal blocking Redis client for the DataCache read path: one socket (unix or TCP), AUTH and
// SELECT on connect, commands sent as RESP arrays, replies read through a buffer or straight into
// the caller's memory. Every failure is returned as a message; the caller drops the connection.
#ifndef TF_COMMLIB_OPS_DATACACHE_REDIS_CONNECTION_H_
#define TF_COMMLIB_OPS_DATACACHE_REDIS_CONNECTION_H_

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tf_commlib {

struct RedisAddress {
  std::string address;   // "unix:/path/to/socket" or "tcp:host:port"
  std::string username;  // empty: AUTH with the password only
  std::string password;  // empty: no AUTH
  int db = 0;
  int timeout_ms = 10000;         // a command: its send and its whole reply
  int connect_timeout_ms = 2000;  // connect()
};

class RedisConnection {
 public:
  // A connected, authenticated socket, or nullptr with *error set.
  static std::unique_ptr<RedisConnection> Open(const RedisAddress& where, std::string* error);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends one command: a RESP array of bulk strings. Its reply must then be read within
  // timeout_ms (a server that trickles a large reply fails it once that has passed).
  bool Send(const std::vector<std::string_view>& args, std::string* error);
  // One reply line without its CRLF.
  bool ReadLine(std::string* line, std::string* error);
  // Exactly n bytes into dst (nullptr: discard them).
  bool Read(char* dst, size_t n, std::string* error);
  // A simple-string reply that must be +OK.
  bool ExpectOk(const char* what, std::string* error);
  const std::string& password() const { return password_; }
  // False when the server closed this idle connection or sent something unasked (a restart):
  // reusing it would fail the next command.
  bool Idle() const;
  // Whether the last failure was a send/receive timeout (a stalled server, not a closed socket).
  bool timed_out() const { return timed_out_; }

 private:
  explicit RedisConnection(int fd) : fd_(fd), buf_(1 << 16) {}
  bool Fill(std::string* error);
  // True (with *error and timed_out_ set) when the reply to the last command is overdue.
  bool Overdue(std::string* error);
  // Before every blocking recv (the one place the deadline is enforced): false (overdue) once
  // the deadline has passed, else bounds the recv's wait by the time left.
  bool Bound(std::string* error);
  void SetRecvTimeout(std::chrono::milliseconds t);
  // Records a failed send/recv (errno): sets *error and timed_out_; returns false.
  bool Failed(const char* what, std::string* error);

  int fd_;
  std::string password_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
  bool timed_out_ = false;
  std::chrono::milliseconds timeout_{10000};
  std::chrono::milliseconds recv_timeout_{10000};  // SO_RCVTIMEO as set now
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_DATACACHE_REDIS_CONNECTION_H_
