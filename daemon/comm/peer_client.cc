#include "daemon/comm/peer_client.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"

namespace railyard {
namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& address) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("peer daemon ", address, ": ", s.error_message()));
}

// Owns what one asynchronous call needs until its callback has run.
template <typename Req, typename Resp>
struct Call {
  grpc::ClientContext ctx;
  Req req;
  Resp resp;
};

}  // namespace

v1::Peer::Stub* PeerClients::Stub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::Peer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  return stub.get();
}

void PeerClients::JoinComm(const std::string& address, const v1::JoinCommRequest& req,
                           absl::Duration timeout, JoinDone done) {
  auto call = std::make_shared<Call<v1::JoinCommRequest, v1::JoinCommResponse>>();
  call->req = req;
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  call->ctx.set_wait_for_ready(true);  // the coordinator may still be starting
  Stub(address)->async()->JoinComm(&call->ctx, &call->req, &call->resp,
                                   [call, address, done](grpc::Status s) {
                                     if (s.ok()) {
                                       done(call->resp);
                                     } else {
                                       done(FromGrpc(s, address));
                                     }
                                   });
}

void PeerClients::AbortComm(const std::string& address, const v1::AbortCommRequest& req) {
  auto call = std::make_shared<Call<v1::AbortCommRequest, v1::AbortCommResponse>>();
  call->req = req;
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  Stub(address)->async()->AbortComm(&call->ctx, &call->req, &call->resp, [call](grpc::Status) {});
}

void PeerClients::Heartbeat(const std::string& address, const std::string& from_node,
                            absl::Duration timeout, std::function<void(const absl::Status&)> done) {
  auto call = std::make_shared<Call<v1::HeartbeatRequest, v1::HeartbeatResponse>>();
  call->req.set_from_node(from_node);
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  Stub(address)->async()->Heartbeat(
      &call->ctx, &call->req, &call->resp,
      [call, address, done](grpc::Status s) { done(FromGrpc(s, address)); });
}

}  // namespace railyard
