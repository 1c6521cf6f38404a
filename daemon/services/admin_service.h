// gRPC railyard.v1.Admin for operators: status and topology (railctl status, topo), the cost
// model's explanations and calibration (railctl explain, calibrate), jobs' fair-share weights
// (railctl jobs).
#pragma once

#include <string>
#include <utility>

#include "daemon/core/daemon_core.h"
#include "daemon/services/grpc_status.h"
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

  grpc::ServerUnaryReactor* Explain(grpc::CallbackServerContext* ctx, const v1::ExplainRequest* req,
                                    v1::ExplainResponse* resp) override {
    absl::StatusOr<v1::ExplainResponse> r = core_->tuning().Explain(*req);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (r.ok()) *resp = *std::move(r);
    reactor->Finish(ToGrpc(r.status()));
    return reactor;
  }
  grpc::ServerUnaryReactor* GetCalibration(grpc::CallbackServerContext* ctx,
                                           const v1::GetCalibrationRequest* req,
                                           v1::CostModel* resp) override {
    *resp = core_->tuning().CostModel();
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* SetCalibration(grpc::CallbackServerContext* ctx,
                                           const v1::CostModel* req,
                                           v1::SetCalibrationResponse* resp) override {
    absl::StatusOr<std::string> path = core_->tuning().SetCalibration(*req);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (path.ok()) resp->set_path(*path);
    reactor->Finish(ToGrpc(path.status()));
    return reactor;
  }
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override {
    *resp = core_->fair_share().ListJobs();
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* SetJobWeight(grpc::CallbackServerContext* ctx,
                                         const v1::SetJobWeightRequest* req,
                                         v1::SetJobWeightResponse* resp) override {
    absl::StatusOr<double> previous = core_->fair_share().SetWeight(req->job_id(), req->weight());
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (previous.ok()) resp->set_previous_weight(*previous);
    reactor->Finish(ToGrpc(previous.status()));
    return reactor;
  }

  grpc::ServerUnaryReactor* GetCommState(grpc::CallbackServerContext* ctx,
                                         const v1::GetCommStateRequest* req,
                                         v1::GetCommStateResponse* resp) override {
    absl::StatusOr<v1::GetCommStateResponse> r = core_->peer_plane().GetCommState(*req);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (r.ok()) *resp = *std::move(r);
    reactor->Finish(ToGrpc(r.status()));
    return reactor;
  }
  // Answers when every member daemon answered or its deadline passed (on a gRPC thread).
  grpc::ServerUnaryReactor* Diagnose(grpc::CallbackServerContext* ctx,
                                     const v1::DiagnoseRequest* req,
                                     v1::DiagnoseResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    core_->peer_plane().Diagnose(*req,
                                 [reactor, resp](const absl::StatusOr<v1::DiagnoseResponse>& r) {
                                   if (r.ok()) *resp = *r;
                                   reactor->Finish(ToGrpc(r.status()));
                                 });
    return reactor;
  }

 private:
  DaemonCore* core_;
};

}  // namespace railyard
