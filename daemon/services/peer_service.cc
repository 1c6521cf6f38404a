#include "daemon/services/peer_service.h"

#include "daemon/services/grpc_status.h"

namespace railyard {

PeerIdentity PeerService::Identify(const grpc::CallbackServerContext& ctx) const {
  PeerIdentity who;
  who.peer = ctx.peer();
  return who;
}

grpc::ServerUnaryReactor* PeerService::JoinComm(grpc::CallbackServerContext* ctx,
                                                const v1::JoinCommRequest* req,
                                                v1::JoinCommResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = core_->CoordinateJoin(
      Identify(*ctx), *req, [reactor, resp](const absl::StatusOr<v1::JoinCommResponse>& layout) {
        if (layout.ok()) *resp = *layout;
        reactor->Finish(ToGrpc(layout.status()));
      });
  if (!s.ok()) reactor->Finish(ToGrpc(s));
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                 const v1::HeartbeatRequest* req,
                                                 v1::HeartbeatResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<v1::HeartbeatResponse> answer = core_->Heartbeat(Identify(*ctx), *req);
  if (answer.ok()) *resp = *std::move(answer);
  reactor->Finish(ToGrpc(answer.status()));
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::AbortComm(grpc::CallbackServerContext* ctx,
                                                 const v1::AbortCommRequest* req,
                                                 v1::AbortCommResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpc(core_->AbortFromPeer(Identify(*ctx), *req)));
  return reactor;
}

}  // namespace railyard
