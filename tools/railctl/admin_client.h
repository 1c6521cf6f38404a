// railctl's connection to a daemon's Admin service, on the daemon's admin socket (never its client
// socket, which serves tenants).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "railyard/v1/admin.grpc.pb.h"

namespace railyard::railctl {

class AdminClient {
 public:
  // socket: the daemon's client socket (--socket); admin_socket: its --admin_socket, or empty for
  // $RAILYARD_ADMIN_SOCKET when socket is the default one, else "<socket>.admin" (the daemon's
  // default).
  explicit AdminClient(const std::string& socket, const std::string& admin_socket = "");

  // Admin.Status with a deadline. UNAVAILABLE names the socket when the daemon is not there.
  absl::StatusOr<v1::StatusResponse> Status();
  // Admin.GetTopology: the daemon's node graph. UNAVAILABLE / DEADLINE_EXCEEDED (naming the
  // socket) when no daemon answers within `timeout`.
  absl::StatusOr<v1::NodeTopology> GetTopology(std::chrono::milliseconds timeout);
  // Admin.Explain / GetCalibration / SetCalibration (railctl explain, calibrate).
  absl::StatusOr<v1::ExplainResponse> Explain(const v1::ExplainRequest& req);
  absl::StatusOr<v1::CostModel> GetCalibration();
  absl::StatusOr<std::string> SetCalibration(const v1::CostModel& model);
  // Admin.ListJobs / SetJobWeight (railctl jobs); SetJobWeight returns the previous weight.
  absl::StatusOr<v1::ListJobsResponse> ListJobs();
  absl::StatusOr<double> SetJobWeight(const std::string& job, double weight);
  // Admin.Diagnose (railctl diagnose): waits the request's timeout for the other daemons, plus
  // the usual RPC allowance.
  absl::StatusOr<v1::DiagnoseResponse> Diagnose(const v1::DiagnoseRequest& req);

 private:
  absl::Status CheckSocket() const;
  absl::Status FromGrpc(const char* rpc, const grpc::Status& status) const;

  std::string socket_;
  std::unique_ptr<v1::Admin::Stub> stub_;
};

}  // namespace railyard::railctl
