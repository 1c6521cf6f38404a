// railyard.v1.Admin as the client socket serves it: to nobody. Tenants connect there, and Admin
// shows every job on the node, so each call is PERMISSION_DENIED saying where operators find it
// (--admin_socket) instead of gRPC's bare UNIMPLEMENTED.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "railyard/v1/admin.grpc.pb.h"

namespace railyard {

class AdminRefusal final : public v1::Admin::CallbackService {
 public:
  explicit AdminRefusal(std::string admin_socket)
      : why_(absl::StrCat("Admin is not served on the client socket, which tenants share; "
                          "operators use the admin socket ",
                          admin_socket, " (--admin_socket, mode 0600)")) {}

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest*,
                                   v1::StatusResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* GetTopology(grpc::CallbackServerContext* ctx,
                                        const v1::GetTopologyRequest*,
                                        v1::GetTopologyResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* Explain(grpc::CallbackServerContext* ctx, const v1::ExplainRequest*,
                                    v1::ExplainResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* GetCalibration(grpc::CallbackServerContext* ctx,
                                           const v1::GetCalibrationRequest*,
                                           v1::CostModel*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* SetCalibration(grpc::CallbackServerContext* ctx, const v1::CostModel*,
                                           v1::SetCalibrationResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest*,
                                     v1::ListJobsResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* SetJobWeight(grpc::CallbackServerContext* ctx,
                                         const v1::SetJobWeightRequest*,
                                         v1::SetJobWeightResponse*) override {
    return Refuse(ctx);
  }

 private:
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, why_));
    return reactor;
  }
  const std::string why_;
};

}  // namespace railyard
