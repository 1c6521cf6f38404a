#include "daemon/services/peer_service.h"

#include "daemon/services/grpc_status.h"

namespace railyard {

grpc::ServerUnaryReactor* PeerService::JoinComm(grpc::CallbackServerContext* ctx,
                                                const v1::JoinCommRequest* req,
                                                v1::JoinCommResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = core_->CoordinateJoin(
      *req, [reactor, resp](const absl::StatusOr<v1::JoinCommResponse>& layout) {
        if (layout.ok()) *resp = *layout;
        reactor->Finish(ToGrpc(layout.status()));
      });
  if (!s.ok()) reactor->Finish(ToGrpc(s));
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                 const v1::HeartbeatRequest*,
                                                 v1::HeartbeatResponse* resp) {
  resp->set_node_name(core_->config().node_name);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::AbortComm(grpc::CallbackServerContext* ctx,
                                                 const v1::AbortCommRequest* req,
                                                 v1::AbortCommResponse*) {
  core_->AbortFromPeer(*req);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace railyard
