// railyardd's lifetime: the Unix socket, the gRPC server and its services, and clean shutdown.
#pragma once

#include <atomic>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "daemon/config.h"
#include "daemon/core/daemon_core.h"
#include "daemon/handover/handover.h"
#include "daemon/metrics/http_server.h"
#include "daemon/services/admin_refusal.h"
#include "daemon/services/admin_service.h"
#include "daemon/services/client_listener.h"
#include "daemon/services/local_service.h"
#include "daemon/services/peer_service.h"
#include "daemon/test_hooks.h"
#include "grpcpp/server.h"

namespace railyard {

class Server {
 public:
  // hooks: the test build's fakes (daemon/test_hooks.h); none in the installed daemon.
  explicit Server(DaemonConfig config, TestHooks hooks = {})
      : config_(std::move(config)), hooks_(std::move(hooks)) {}
  ~Server();

  // Loads the authentication (token keys, job tokens, job policy) and topology files, checks the
  // peer plane's TLS files against the node name (refusing a certificate other daemons would
  // refuse), starts the peer service and the transport when --peer_listen is set, prepares the
  // socket paths (creating their directories, refusing when another daemon answers on one, removing
  // a stale file) and starts serving: Local on --socket, the buffer side channel on <socket>.fd,
  // Admin on
  // --admin_socket.
  absl::Status Start();
  // host:port the peer service is reachable at ("" without --peer_listen).
  const std::string& peer_address() const { return peer_address_; }
  // host:port of /metrics ("" without --metrics_listen).
  const std::string& metrics_address() const { return metrics_address_; }
  // Fails in-flight collectives with CANCELLED, finishes sessions, stops the gRPC server (RPCs
  // still running after the grace period are cancelled) and removes the socket file. Idempotent.
  void Shutdown();
  // SIGHUP: reloads --job_weights (an error keeps the weights in use, and is logged).
  void Reload();

 private:
  DaemonConfig config_;
  const TestHooks hooks_;
  std::unique_ptr<DaemonCore> core_;
  std::unique_ptr<LocalService> local_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<AdminRefusal> admin_refusal_;  // Admin on the client socket: refused
  std::unique_ptr<PeerService> peer_;
  std::unique_ptr<FdChannelServer> fd_channels_;  // <socket>.fd
  std::unique_ptr<grpc::Server> grpc_;            // Local, on --socket (listener_ admits)
  std::unique_ptr<RefusalServer> refusals_;       // connections the listener refused
  std::unique_ptr<ClientListener> listener_;      // accepts on --socket
  std::unique_ptr<grpc::Server> admin_grpc_;      // Admin, on --admin_socket only
  std::unique_ptr<grpc::Server> peer_grpc_;       // TCP, daemon<->daemon only
  bool socket_created_ = false;
  bool admin_socket_created_ = false;
  std::string peer_address_;
  // The peer plane's mutual TLS material; nullopt with --peer_insecure or without --peer_listen.
  std::optional<auth::PeerTlsPem> peer_tls_;
  std::unique_ptr<metrics::HttpServer> metrics_http_;
  // --takeover: the old daemon's offer, until this one serves.
  std::optional<handover::Takeover> takeover_;
  // "<socket>.handover": a later railyardd --takeover takes the node over from this one.
  std::unique_ptr<handover::HandoverServer> handover_;
  std::string metrics_address_;
  std::atomic<bool> serving_{false};  // what /readyz reports: the gRPC APIs are up

  // The client listener's counts on /metrics (railyard_client_connections...).
  void ExportListenerMetrics();
  absl::Status StartMetrics();
  absl::Status StartAdmin();
  absl::Status StartHandover();
  // Who may connect as which job, from the config's files.
  absl::StatusOr<SessionAuth> LoadAuth() const;

  absl::Status StartPeerService(const v1::NodeTopology& topology);
};

}  // namespace railyard
