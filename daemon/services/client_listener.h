// The client socket's own listener. gRPC's server accepts until the process runs out of
// descriptors and then never recovers (issue 55: ~20,300 plain connections without a token left
// --socket dead until a restart). So railyardd accepts on --socket itself and admits each
// connection before gRPC sees it: per uid (SO_PEERCRED) up to its share, in all up to a cap, and
// only while a reserve of descriptors stays free for everything else (memfds, UCX, the peer and
// admin sockets). An admitted connection is handed to the Local server
// (grpc::AddInsecureChannelFromFd); a refused one to a small refusal server whose every call is
// RESOURCE_EXHAUSTED naming the limit and its flag, and which drops it after two seconds. At
// most max_refusing connections wait there: a newer refusal shuts the oldest down, so the latest
// caller always hears why (a flood cannot make a refused caller see a bare broken pipe). The
// listener never spins: on EMFILE it frees a spare descriptor, takes the connection off the queue,
// closes it and backs off.
//
// It learns that gRPC closed a connection by sweeping its table: each admitted descriptor is
// kept with the socket's inode, and a descriptor that no longer names that inode was closed.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/util/caller_shares.h"

namespace grpc {
class CallbackGenericService;
class Server;
}  // namespace grpc

namespace railyard {

class ClientListener {
 public:
  struct Options {
    std::string path;               // the socket to create (mode 0660)
    size_t max_connections = 4096;  // --max_client_connections
    size_t max_per_uid = 512;       // --max_client_connections_per_uid (0: no share)
    // Descriptors kept free: a connection whose descriptor number reaches the soft
    // RLIMIT_NOFILE minus this is refused.
    size_t fd_reserve = 256;
    size_t max_refusing = 64;  // refused connections answered at once (more: the oldest shut)
  };
  struct Counts {
    size_t open = 0;             // admitted, not yet closed by gRPC
    size_t refusing = 0;         // in the refusal server
    uint64_t refused_share = 0;  // since start, by reason
    uint64_t refused_pool = 0;
    uint64_t refused_descriptors = 0;
    uint64_t accept_failures = 0;  // EMFILE/ENFILE and the like
    uint64_t refusals_cut = 0;     // refusing connections shut early for a newer refusal
  };

  // Binds and listens (UNAVAILABLE naming the path when it cannot).
  static absl::StatusOr<std::unique_ptr<ClientListener>> Bind(Options options);
  // Serves a listening socket at options.path that another railyardd handed over (railyardd
  // --takeover): owns listen_fd. INVALID_ARGUMENT when it is not a listening Unix stream socket.
  static absl::StatusOr<std::unique_ptr<ClientListener>> Adopt(Options options, int listen_fd);
  // The listening socket (to hand over; the listener keeps it).
  int listen_fd() const { return listen_fd_; }
  // Stops accepting and leaves the socket file to the daemon that took it over. Idempotent.
  void Release();
  ~ClientListener();  // Stop()
  ClientListener(const ClientListener&) = delete;
  ClientListener& operator=(const ClientListener&) = delete;

  // Starts accepting: admitted connections go to `server`, refused ones to `refusals` (built by
  // MakeRefusalServer). Both outlive the listener's thread (Stop before destroying them).
  void Start(grpc::Server* server, grpc::Server* refusals);
  // Stops accepting and removes the socket file. Idempotent.
  void Stop();

  Counts counts();
  // Why the connection gRPC names `peer` ("fd:N") was refused, for the refusal server.
  std::string RefusalOf(const std::string& peer);

  // The soft RLIMIT_NOFILE raised to the hard one; the limit now.
  static uint64_t RaiseDescriptorLimit();

 private:
  // Bind and Adopt's common part, once listen_fd_ listens.
  static absl::StatusOr<std::unique_ptr<ClientListener>> Ready(std::unique_ptr<ClientListener> l);
  explicit ClientListener(Options options) : options_(std::move(options)) {}
  struct Conn {
    ino_t inode = 0;
    uid_t uid = 0;
    bool refusing = false;
    // A refusing connection: our duplicate of its descriptor (gRPC owns the original, so only
    // this one may be shut down or closed here), and its place in refusing_order_.
    int own_fd = -1;
    uint64_t seq = 0;
  };
  void Run();
  void AcceptAll();
  // Forgets connections gRPC has closed.
  void SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the connection on descriptor fd, if any (its share back).
  void ForgetLocked(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shuts the oldest refusing connection down, to make room for a newer refusal.
  void CutOldestRefusalLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes one connection off the queue and closes it (the table is full: EMFILE).
  void ShedOne();

  Options options_;  // path cleared by Release()
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int spare_fd_ = -1;  // /dev/null, given up to shed a connection on EMFILE
  uint64_t fd_limit_ = 0;
  grpc::Server* server_ = nullptr;
  grpc::Server* refusals_ = nullptr;
  std::thread thread_;
  bool stopped_ = false;

  absl::Mutex mu_;
  std::map<int, Conn> conns_ ABSL_GUARDED_BY(mu_);  // by descriptor
  CallerShares<uid_t> shares_ ABSL_GUARDED_BY(mu_){options_.max_connections, options_.max_per_uid};
  std::map<int, std::string> reasons_ ABSL_GUARDED_BY(mu_);  // refusing connections' why
  std::deque<std::pair<int, uint64_t>> refusing_order_
      ABSL_GUARDED_BY(mu_);  // (fd, seq), oldest 1st
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  Counts counts_ ABSL_GUARDED_BY(mu_);
  absl::Time last_refusal_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t unlogged_refusals_ ABSL_GUARDED_BY(mu_) = 0;
};

// The refusal server: no listening port, every method of every service RESOURCE_EXHAUSTED with
// listener->RefusalOf(the connection), connections dropped after about two seconds.
class RefusalServer {
 public:
  explicit RefusalServer(ClientListener* listener);
  ~RefusalServer();  // shuts the server down (at once) before the service goes
  grpc::Server* server() const { return server_.get(); }

 private:
  std::unique_ptr<grpc::CallbackGenericService> service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace railyard
