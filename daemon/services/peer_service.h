// gRPC railyard.v1.Peer: what other daemons ask of this one (bootstrap, liveness, aborts).
// Served on --peer_listen (TCP), never on the local Unix socket.
#pragma once

#include "daemon/core/daemon_core.h"
#include "railyard/v1/peer.grpc.pb.h"

namespace railyard {

class PeerService final : public v1::Peer::CallbackService {
 public:
  explicit PeerService(DaemonCore* core) : core_(core) {}

  grpc::ServerUnaryReactor* JoinComm(grpc::CallbackServerContext* ctx,
                                     const v1::JoinCommRequest* req,
                                     v1::JoinCommResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* AbortComm(grpc::CallbackServerContext* ctx,
                                      const v1::AbortCommRequest* req,
                                      v1::AbortCommResponse* resp) override;
  grpc::ServerUnaryReactor* GetCommState(grpc::CallbackServerContext* ctx,
                                         const v1::PeerCommStateRequest* req,
                                         v1::CommState* resp) override;

 private:
  // Who called: the verified certificate's names under mutual TLS, nothing under --peer_insecure.
  PeerIdentity Identify(const grpc::CallbackServerContext& ctx) const;

  DaemonCore* core_;
};

}  // namespace railyard
