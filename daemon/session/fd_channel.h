// The daemon's end of the buffer side channel (proto/railyard/v1/fd_channel.h): a SOCK_SEQPACKET
// Unix socket beside the client socket, served by one thread with epoll. Each connection learns
// its peer's credentials (SO_PEERCRED) when it is accepted, is handed a one-time ticket that
// Local.Connect names to bind it to the new session, and then carries the client's buffer
// descriptors, each kept under a one-time handle until RegisterBuffer takes it.
//
// Everything arriving here is untrusted: malformed messages end the connection, descriptors
// beyond one per PUT are closed, pending descriptors per connection, connections per daemon and
// connections not yet bound to a session are bounded, and an unbound connection is dropped after
// bind_timeout. The thread never blocks on a client: a client that does not read its replies is
// dropped.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/session/peer_cred.h"
#include "daemon/util/caller_shares.h"
#include "daemon/util/unique_fd.h"

namespace railyard {

class FdChannel {
 public:
  FdChannel(int fd, PeerCred cred, std::string ticket, absl::Time opened)
      : fd_(fd), cred_(cred), ticket_(std::move(ticket)), opened_(opened) {}

  const PeerCred& cred() const { return cred_; }
  // The descriptor the client sent under `handle`, once. NOT_FOUND for a handle this connection
  // never gave out or that was taken already; FAILED_PRECONDITION once the connection is gone.
  absl::StatusOr<UniqueFd> Take(uint64_t handle);
  // The session ended: ends the connection and closes the descriptors still pending.
  void Close();
  size_t pending() const;

 private:
  friend class FdChannelServer;
  // Server thread: keeps fd under a new handle; RESOURCE_EXHAUSTED beyond max_pending.
  absl::StatusOr<uint64_t> Put(UniqueFd fd, size_t max_pending);
  // Server thread: the connection is gone; closes its socket and the pending descriptors.
  void Drop();

  mutable absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);  // the connection; closed only by Drop, under mu_
  const PeerCred cred_;
  const std::string ticket_;
  const absl::Time opened_;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, UniqueFd> pending_ ABSL_GUARDED_BY(mu_);
};

class FdChannelServer {
 public:
  struct Options {
    std::string path;  // the socket to create (its directory exists)
    size_t max_connections = 1024 + 256;
    size_t max_unbound = 256;  // connections whose ticket no Connect has named yet
    // Of those, what one uid (SO_PEERCRED) may hold (0: no share): a process without a token
    // that keeps re-dialling holds its uid's share, not every job's Connect.
    size_t max_unbound_per_uid = 32;
    size_t max_pending_fds = 64;  // descriptors sent but not yet registered, per connection
    absl::Duration bind_timeout = absl::Seconds(10);
  };
  // Binds (mode 0660) and starts serving. UNAVAILABLE naming the path when it cannot.
  static absl::StatusOr<std::unique_ptr<FdChannelServer>> Start(Options options);
  // The same on a listening socket at options.path that another railyardd handed over (railyardd
  // --takeover): owns listen_fd. INVALID_ARGUMENT when it is not a listening SOCK_SEQPACKET.
  static absl::StatusOr<std::unique_ptr<FdChannelServer>> Adopt(Options options, int listen_fd);
  // The listening socket (to hand over; the server keeps it).
  int listen_fd() const { return listen_fd_; }
  // Stop(), leaving the socket file to the daemon that took it over.
  void Release();
  ~FdChannelServer();
  FdChannelServer(const FdChannelServer&) = delete;
  FdChannelServer& operator=(const FdChannelServer&) = delete;

  // The connection that was handed `ticket`, once: NOT_FOUND for an unknown, used or expired
  // ticket, FAILED_PRECONDITION when that connection is gone already.
  absl::StatusOr<std::shared_ptr<FdChannel>> Claim(const std::string& ticket);
  // Stops the thread, ends every connection and removes the socket file. Idempotent.
  void Stop();

  size_t connections() const;

 private:
  explicit FdChannelServer(Options options) : options_(std::move(options)) {}
  void Run();
  void AcceptAll();
  // Reads what a connection sent; false when it must be dropped.
  bool ReadFrom(const std::shared_ptr<FdChannel>& channel, int fd);
  void DropConnection(int fd, const char* why);
  void SweepUnbound(absl::Time now);

  Options options_;  // path cleared by Release()
  // Start/Adopt's common part: the epoll set and the thread.
  static absl::StatusOr<std::unique_ptr<FdChannelServer>> Serve(std::unique_ptr<FdChannelServer> s);
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  bool stopped_ = false;

  mutable absl::Mutex mu_;
  std::map<int, std::shared_ptr<FdChannel>> by_fd_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<FdChannel>> unbound_ ABSL_GUARDED_BY(mu_);
  // unbound_ counted by uid against the shares.
  CallerShares<uint32_t> unbound_shares_ ABSL_GUARDED_BY(mu_){options_.max_unbound,
                                                              options_.max_unbound_per_uid};
  void EraseUnboundLocked(std::map<std::string, std::shared_ptr<FdChannel>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace railyard
