#include "daemon/comm/peer_client.h"

#include <utility>

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

absl::Status NoCredentials(const std::string& address) {
  return absl::FailedPreconditionError(absl::StrCat(
      "peer daemon ", address, ": the peer client has no credentials (SetTls or SetInsecure)"));
}

// Owns what one asynchronous call needs until its callback has run.
template <typename Req, typename Resp>
struct Call {
  grpc::ClientContext ctx;
  Req req;
  Resp resp;
};

}  // namespace

void PeerClients::SetTls(const std::string& ca_pem, const std::string& cert_chain_pem,
                         const std::string& private_key_pem) {
  grpc::SslCredentialsOptions opts;
  opts.pem_root_certs = ca_pem;
  opts.pem_cert_chain = cert_chain_pem;
  opts.pem_private_key = private_key_pem;
  absl::MutexLock lock(&mu_);
  credentials_ = grpc::SslCredentials(opts);
  tls_ = true;
  channels_.clear();
  insertion_order_.clear();
}

void PeerClients::SetInsecure() {
  absl::MutexLock lock(&mu_);
  credentials_ = grpc::InsecureChannelCredentials();
  tls_ = false;
  channels_.clear();
  insertion_order_.clear();
}

std::shared_ptr<PeerClients::Channel> PeerClients::Get(const std::string& address,
                                                       const std::string& expected_node) {
  absl::MutexLock lock(&mu_);
  if (credentials_ == nullptr) return nullptr;
  // Without TLS there is nothing to check a name against: one channel per address.
  Key key(address, tls_ ? expected_node : std::string());
  std::shared_ptr<Channel>& ch = channels_[key];
  if (ch == nullptr) {
    ch = std::make_shared<Channel>();
    grpc::ChannelArguments args;
    if (!key.second.empty()) args.SetSslTargetNameOverride(key.second);
    ch->channel = grpc::CreateCustomChannel(address, credentials_, args);
    ch->stub = v1::Peer::NewStub(ch->channel);
    std::shared_ptr<Channel> made = ch;  // the map may drop its reference below
    insertion_order_.push_back(std::move(key));
    while (channels_.size() > kMaxChannels) {
      channels_.erase(insertion_order_.front());
      insertion_order_.pop_front();
    }
    return made;
  }
  return ch;
}

void PeerClients::JoinComm(const std::string& address, const v1::JoinCommRequest& req,
                           absl::Duration timeout, JoinDone done) {
  std::shared_ptr<Channel> ch = Get(address, "");
  if (ch == nullptr) {
    done(NoCredentials(address));
    return;
  }
  auto call = std::make_shared<Call<v1::JoinCommRequest, v1::JoinCommResponse>>();
  call->req = req;
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  call->ctx.set_wait_for_ready(true);  // the coordinator may still be starting
  std::shared_ptr<grpc::Channel> channel = ch->channel;
  ch->stub->async()->JoinComm(
      &call->ctx, &call->req, &call->resp,
      [call, address, ch, channel, done = std::move(done)](const grpc::Status& s) {
        if (s.ok()) {
          done(call->resp);
          return;
        }
        // Waiting for a channel that never connected (refused, or a TLS handshake that keeps
        // failing) ends in DEADLINE_EXCEEDED: say that the coordinator was not reached.
        if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
            channel->GetState(false) != GRPC_CHANNEL_READY) {
          done(absl::UnavailableError(absl::StrCat(
              "peer daemon ", address,
              ": coordinator not reached before the deadline: connection or TLS handshake "
              "failing (is it up, and are both daemons' certificates signed by the same "
              "--peer_tls_ca, the coordinator's naming ",
              address.substr(0, address.rfind(':')), "?): ", s.error_message())));
          return;
        }
        done(FromGrpc(s, address));
      });
}

void PeerClients::AbortComm(const std::string& address, const std::string& expected_node,
                            const v1::AbortCommRequest& req) {
  std::shared_ptr<Channel> ch = Get(address, expected_node);
  if (ch == nullptr) return;
  auto call = std::make_shared<Call<v1::AbortCommRequest, v1::AbortCommResponse>>();
  call->req = req;
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  ch->stub->async()->AbortComm(&call->ctx, &call->req, &call->resp,
                               [call, ch](const grpc::Status&) {});
}

void PeerClients::Heartbeat(const std::string& address, const std::string& expected_node,
                            const std::string& from_node, absl::Duration timeout,
                            std::function<void(const absl::Status&)> done) {
  std::shared_ptr<Channel> ch = Get(address, expected_node);
  if (ch == nullptr) {
    done(NoCredentials(address));
    return;
  }
  auto call = std::make_shared<Call<v1::HeartbeatRequest, v1::HeartbeatResponse>>();
  call->req.set_from_node(from_node);
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  ch->stub->async()->Heartbeat(&call->ctx, &call->req, &call->resp,
                               [call, ch, address, done = std::move(done)](const grpc::Status& s) {
                                 done(FromGrpc(s, address));
                               });
}

void PeerClients::GetCommState(const std::string& address, const std::string& expected_node,
                               const v1::PeerCommStateRequest& req, absl::Duration timeout,
                               std::function<void(const absl::StatusOr<v1::CommState>&)> done) {
  std::shared_ptr<Channel> ch = Get(address, expected_node);
  if (ch == nullptr) {
    done(NoCredentials(address));
    return;
  }
  auto call = std::make_shared<Call<v1::PeerCommStateRequest, v1::CommState>>();
  call->req = req;
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  ch->stub->async()->GetCommState(
      &call->ctx, &call->req, &call->resp,
      [call, ch, address, done = std::move(done)](const grpc::Status& s) {
        if (s.ok()) {
          done(call->resp);
        } else {
          done(FromGrpc(s, address));
        }
      });
}

}  // namespace railyard
