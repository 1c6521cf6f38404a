// Calls to other daemons' Peer services, over one cached channel per (address, expected name).
//
// Security: SetTls (mutual TLS: the cluster CA and this daemon's certificate and key) or
// SetInsecure (plaintext, --peer_insecure) must be called once, before the first call; calls
// made before either fail with FAILED_PRECONDITION. With TLS, the server's certificate must chain
// to the CA and name what is dialled: by default the host of the address (gRPC's hostname check:
// a coordinator named in a comm id, "10.0.0.2:7470" or "node-a:7470", needs that IP or DNS
// subjectAltName), or, when the caller passes expected_node, that node name (the daemons of a
// layout, whose names the coordinator vouched for).
//
// The cache holds at most kMaxChannels channels (a local client can name any host:port as a
// coordinator in a comm id): past that the oldest is dropped; calls in flight keep theirs.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "railyard/v1/peer.grpc.pb.h"

namespace railyard {

// The calls this daemon makes to other daemons' Peer services (a fake in unit tests of what
// makes them: PeerPlane, CommFactory).
class PeerCalls {
 public:
  using JoinDone = std::function<void(const absl::StatusOr<v1::JoinCommResponse>&)>;
  virtual ~PeerCalls() = default;
  // Asynchronous; done runs on another thread. The coordinator's certificate must name the host
  // of address. UNAVAILABLE names the address when the coordinator cannot be reached (also when
  // the TLS handshake keeps failing until the deadline).
  virtual void JoinComm(const std::string& address, const v1::JoinCommRequest& req,
                        absl::Duration timeout, JoinDone done) = 0;
  // Fire and forget (best effort: the peer also finds out through its own deadlines). With TLS
  // the peer's certificate must name expected_node.
  virtual void AbortComm(const std::string& address, const std::string& expected_node,
                         const v1::AbortCommRequest& req) = 0;
  // Asynchronous liveness probe; done(OK) when the peer answered within timeout. With TLS the
  // peer's certificate must name expected_node.
  virtual void Heartbeat(const std::string& address, const std::string& expected_node,
                         const std::string& from_node, absl::Duration timeout,
                         std::function<void(const absl::Status&)> done) = 0;
  // Asynchronous: the peer's view of a communicator (railctl diagnose); done runs on another
  // thread. With TLS the peer's certificate must name expected_node.
  virtual void GetCommState(const std::string& address, const std::string& expected_node,
                            const v1::PeerCommStateRequest& req, absl::Duration timeout,
                            std::function<void(const absl::StatusOr<v1::CommState>&)> done) = 0;
};

class PeerClients : public PeerCalls {
 public:
  static constexpr size_t kMaxChannels = 1024;

  // Mutual TLS with PEM text: the CA peers' certificates must chain to, this daemon's
  // certificate (chain) and its private key (presented as client certificate).
  void SetTls(const std::string& ca_pem, const std::string& cert_chain_pem,
              const std::string& private_key_pem);
  // Plaintext, nothing verified (--peer_insecure).
  void SetInsecure();

  // done runs on a gRPC thread.
  void JoinComm(const std::string& address, const v1::JoinCommRequest& req, absl::Duration timeout,
                JoinDone done) override;
  void AbortComm(const std::string& address, const std::string& expected_node,
                 const v1::AbortCommRequest& req) override;
  void Heartbeat(const std::string& address, const std::string& expected_node,
                 const std::string& from_node, absl::Duration timeout,
                 std::function<void(const absl::Status&)> done) override;
  // done runs on a gRPC thread.
  void GetCommState(const std::string& address, const std::string& expected_node,
                    const v1::PeerCommStateRequest& req, absl::Duration timeout,
                    std::function<void(const absl::StatusOr<v1::CommState>&)> done) override;

  // Channels cached now (tests).
  size_t cached_channels() {
    absl::MutexLock lock(&mu_);
    return channels_.size();
  }

 private:
  struct Channel {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Peer::Stub> stub;
  };
  using Key = std::pair<std::string, std::string>;  // (address, expected node name)
  // Null until SetTls or SetInsecure. expected_node empty: gRPC's check of the dialled host.
  std::shared_ptr<Channel> Get(const std::string& address, const std::string& expected_node);

  absl::Mutex mu_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_ ABSL_GUARDED_BY(mu_);
  bool tls_ ABSL_GUARDED_BY(mu_) = false;
  std::map<Key, std::shared_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  std::deque<Key> insertion_order_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace railyard
