// gRPC railyard.v1.Admin: read-only status for operators (railctl status).
#pragma once

#include "daemon/daemon_core.h"
#include "railyard/v1/admin.grpc.pb.h"

namespace railyard {

class AdminService final : public v1::Admin::CallbackService {
 public:
  explicit AdminService(DaemonCore* core) : core_(core) {}
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest* req,
                                   v1::StatusResponse* resp) override {
    *resp = core_->Status();
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* GetTopology(grpc::CallbackServerContext* ctx,
                                        const v1::GetTopologyRequest* req,
                                        v1::GetTopologyResponse* resp) override {
    *resp->mutable_topology() = core_->NodeGraph();
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  DaemonCore* core_;
};

}  // namespace railyard
