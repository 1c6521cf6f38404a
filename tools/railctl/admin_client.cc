#include "tools/railctl/admin_client.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tools/railctl/command.h"

namespace railyard::railctl {
namespace {

constexpr std::chrono::seconds kRpcTimeout{10};

std::string ErrnoText(int err) {
  char buffer[256];
  return strerror_r(err, buffer, sizeof(buffer));  // the GNU variant returns the text
}

}  // namespace

std::string AdminSocketFor(const std::string& socket, const std::string& admin_socket) {
  if (!admin_socket.empty()) return admin_socket;
  // NOLINTNEXTLINE(concurrency-mt-unsafe): nothing sets the environment.
  const char* env = std::getenv("RAILYARD_ADMIN_SOCKET");
  if (env != nullptr && *env != '\0' && socket == DefaultSocket()) return env;
  return socket + ".admin";
}

AdminClient::AdminClient(const std::string& socket, const std::string& admin_socket)
    : socket_(AdminSocketFor(socket, admin_socket)) {
  stub_ = v1::Admin::NewStub(
      grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
}

absl::Status AdminClient::CheckSocket() const {
  if (socket_.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path ", socket_, " is too long for a Unix socket"));
  }
  struct stat st;
  if (stat(socket_.c_str(), &st) != 0) {
    return absl::UnavailableError(
        absl::StrCat("railyardd not reachable at ", socket_, ": ", ErrnoText(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::UnavailableError(
        absl::StrCat("railyardd not reachable at ", socket_, ": not a Unix socket"));
  }
  return absl::OkStatus();
}

absl::Status AdminClient::FromGrpc(const char* rpc, const grpc::Status& status) const {
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(code, absl::StrCat("railyardd not reachable at ", socket_, ": ", rpc, ": ",
                                           status.error_message()));
  }
  return absl::Status(code, absl::StrCat(rpc, ": ", status.error_message()));
}

absl::StatusOr<v1::StatusResponse> AdminClient::Status() {
  if (absl::Status st = CheckSocket(); !st.ok()) return st;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
  v1::StatusResponse response;
  grpc::Status status = stub_->Status(&ctx, v1::StatusRequest(), &response);
  if (!status.ok()) return FromGrpc("Admin.Status", status);
  return response;
}

absl::StatusOr<v1::NodeTopology> AdminClient::GetTopology(std::chrono::milliseconds timeout) {
  if (absl::Status st = CheckSocket(); !st.ok()) return st;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::GetTopologyResponse response;
  grpc::Status status = stub_->GetTopology(&ctx, v1::GetTopologyRequest(), &response);
  if (!status.ok()) return FromGrpc("Admin.GetTopology", status);
  return response.topology();
}

absl::StatusOr<v1::ExplainResponse> AdminClient::Explain(const v1::ExplainRequest& req) {
  if (absl::Status st = CheckSocket(); !st.ok()) return st;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
  v1::ExplainResponse response;
  grpc::Status status = stub_->Explain(&ctx, req, &response);
  if (!status.ok()) return FromGrpc("Admin.Explain", status);
  return response;
}

absl::StatusOr<v1::CostModel> AdminClient::GetCalibration() {
  if (absl::Status st = CheckSocket(); !st.ok()) return st;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
  v1::CostModel response;
  grpc::Status status = stub_->GetCalibration(&ctx, v1::GetCalibrationRequest(), &response);
  if (!status.ok()) return FromGrpc("Admin.GetCalibration", status);
  return response;
}

absl::StatusOr<std::string> AdminClient::SetCalibration(const v1::CostModel& model) {
  if (absl::Status st = CheckSocket(); !st.ok()) return st;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
  v1::SetCalibrationResponse response;
  grpc::Status status = stub_->SetCalibration(&ctx, model, &response);
  if (!status.ok()) return FromGrpc("Admin.SetCalibration", status);
  return response.path();
}

absl::StatusOr<v1::ListJobsResponse> AdminClient::ListJobs() {
  if (absl::Status st = CheckSocket(); !st.ok()) return st;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
  v1::ListJobsResponse response;
  grpc::Status status = stub_->ListJobs(&ctx, v1::ListJobsRequest(), &response);
  if (!status.ok()) return FromGrpc("Admin.ListJobs", status);
  return response;
}

absl::StatusOr<v1::DiagnoseResponse> AdminClient::Diagnose(const v1::DiagnoseRequest& req) {
  if (absl::Status st = CheckSocket(); !st.ok()) return st;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcTimeout +
                   std::chrono::milliseconds(req.timeout_ms() > 0 ? req.timeout_ms() : 2000));
  v1::DiagnoseResponse response;
  grpc::Status status = stub_->Diagnose(&ctx, req, &response);
  if (!status.ok()) return FromGrpc("Admin.Diagnose", status);
  return response;
}

absl::StatusOr<double> AdminClient::SetJobWeight(const std::string& job, double weight) {
  if (absl::Status st = CheckSocket(); !st.ok()) return st;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
  v1::SetJobWeightRequest req;
  req.set_job_id(job);
  req.set_weight(weight);
  v1::SetJobWeightResponse response;
  grpc::Status status = stub_->SetJobWeight(&ctx, req, &response);
  if (!status.ok()) return FromGrpc("Admin.SetJobWeight", status);
  return response.previous_weight();
}

}  // namespace railyard::railctl
