#include "daemon/services/peer_service.h"

#include <memory>
#include <string>
#include <vector>

#include "daemon/auth/peer_tls.h"
#include "daemon/services/grpc_status.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"

namespace railyard {

namespace {

std::vector<std::string> Values(const grpc::AuthContext& auth, const char* property) {
  std::vector<std::string> out;
  for (const grpc::string_ref& v : auth.FindPropertyValues(property)) {
    out.emplace_back(v.data(), v.size());
  }
  return out;
}

}  // namespace

PeerIdentity PeerService::Identify(const grpc::CallbackServerContext& ctx) const {
  PeerIdentity who;
  who.peer = ctx.peer();
  const std::shared_ptr<const grpc::AuthContext> actx = ctx.auth_context();
  // Under --peer_insecure there is no certificate: unauthenticated, names empty.
  if (actx == nullptr || !actx->IsPeerAuthenticated()) return who;
  // gRPC (1.51 on) splits the verified leaf certificate's subjectAltNames by type: "peer_dns"
  // and "peer_ip". Older ones only give the whole certificate: read it the way the daemon reads
  // its own (auth::SubjectAltNames).
  who.dns_names = Values(*actx, GRPC_PEER_DNS_PROPERTY_NAME);
  who.ips = Values(*actx, GRPC_PEER_IP_PROPERTY_NAME);
  if (who.dns_names.empty() && who.ips.empty()) {
    for (const std::string& pem : Values(*actx, GRPC_X509_PEM_CERT_PROPERTY_NAME)) {
      if (absl::StatusOr<auth::CertNames> names = auth::SubjectAltNames(pem); names.ok()) {
        who.dns_names = std::move(names->dns);
        who.ips = std::move(names->ips);
      }
    }
  }
  // Verified by the handshake (the CA signed it): only now may the core trust the names.
  who.authenticated = true;
  return who;
}

grpc::ServerUnaryReactor* PeerService::JoinComm(grpc::CallbackServerContext* ctx,
                                                const v1::JoinCommRequest* req,
                                                v1::JoinCommResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = core_->joins().CoordinateJoin(
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
  absl::StatusOr<v1::HeartbeatResponse> answer =
      core_->peer_plane().Heartbeat(Identify(*ctx), *req);
  if (answer.ok()) *resp = *std::move(answer);
  reactor->Finish(ToGrpc(answer.status()));
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::AbortComm(grpc::CallbackServerContext* ctx,
                                                 const v1::AbortCommRequest* req,
                                                 v1::AbortCommResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpc(core_->peer_plane().AbortFromPeer(Identify(*ctx), *req)));
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::GetCommState(grpc::CallbackServerContext* ctx,
                                                    const v1::PeerCommStateRequest* req,
                                                    v1::CommState* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<v1::CommState> st = core_->peer_plane().PeerCommState(Identify(*ctx), *req);
  if (st.ok()) *resp = *std::move(st);
  reactor->Finish(ToGrpc(st.status()));
  return reactor;
}

}  // namespace railyard
