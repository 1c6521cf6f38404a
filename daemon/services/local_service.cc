#include "daemon/services/local_service.h"

#include <vector>

#include "daemon/util/log.h"
#include "daemon/version.h"

namespace railyard {

namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpc(s));
  return reactor;
}

}  // namespace

grpc::ServerWriteReactor<v1::SessionEvent>* LocalService::Connect(grpc::CallbackServerContext* ctx,
                                                                  const v1::ConnectRequest* req) {
  absl::StatusOr<std::shared_ptr<Session>> session = core_->sessions().Open(*req);
  if (!session.ok()) {
    auto* stream = new SessionStream(nullptr, nullptr);
    stream->Close(ToGrpc(session.status()));
    return stream;
  }
  std::shared_ptr<Session> s = *session;
  DaemonCore* core = core_;
  auto* stream = new SessionStream(
      [core, s] { core->sessions().Close(s, "client disconnected", grpc::Status::CANCELLED); },
      [s] { s->DetachStream(); });
  s->AttachStream(stream);
  v1::SessionEvent event;
  auto* c = event.mutable_connected();
  c->set_session_id(s->id());
  c->set_daemon_version(kRailyardVersion);
  c->set_node_name(core_->config().node_name);
  stream->Send(std::move(event));
  return stream;
}

grpc::ServerUnaryReactor* LocalService::RegisterBuffer(grpc::CallbackServerContext* ctx,
                                                       const v1::RegisterBufferRequest* req,
                                                       v1::RegisterBufferResponse* resp) {
  auto session = core_->sessions().Find(req->session_id());
  if (!session.ok()) return Done(ctx, session.status());
  if (req->parent_buffer_id() != 0) {
    if (req->fd_handle() != 0 || !req->cuda_ipc_handle().empty() ||
        req->memory() != v1::MEMORY_KIND_HOST) {
      return Done(ctx, absl::InvalidArgumentError(
                           "a part of a buffer (parent_buffer_id) comes with no descriptor, no "
                           "CUDA IPC handle and host memory"));
    }
    absl::StatusOr<uint64_t> part = core_->sessions().RegisterPart(
        **session, req->parent_buffer_id(), req->parent_offset(), req->size_bytes());
    if (part.ok()) resp->set_buffer_id(*part);
    return Done(ctx, part.status());
  }
  absl::StatusOr<uint64_t> id = core_->sessions().RegisterBuffer(
      **session, req->fd_handle(), req->size_bytes(), req->memory(), req->device(),
      req->cuda_ipc_handle(), req->cuda_ipc_offset());
  if (id.ok()) resp->set_buffer_id(*id);
  return Done(ctx, id.status());
}

grpc::ServerUnaryReactor* LocalService::ReleaseBuffer(grpc::CallbackServerContext* ctx,
                                                      const v1::ReleaseBufferRequest* req,
                                                      v1::ReleaseBufferResponse*) {
  auto session = core_->sessions().Find(req->session_id());
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, core_->sessions().ReleaseBuffer(**session, req->buffer_id()));
}

grpc::ServerUnaryReactor* LocalService::CreateCommId(grpc::CallbackServerContext* ctx,
                                                     const v1::CreateCommIdRequest* req,
                                                     v1::CreateCommIdResponse* resp) {
  auto session = core_->sessions().Find(req->session_id());
  if (!session.ok()) return Done(ctx, session.status());
  resp->set_comm_id(core_->joins().NewCommId());
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* LocalService::InitComm(grpc::CallbackServerContext* ctx,
                                                 const v1::InitCommRequest* req,
                                                 v1::InitCommResponse* resp) {
  auto session = core_->sessions().Find(req->session_id());
  if (!session.ok()) return Done(ctx, session.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = core_->joins().InitComm(
      *session, *req,
      [reactor, resp](const absl::Status& st, uint64_t handle, int nnodes, uint64_t first_seq) {
        if (st.ok()) {
          resp->set_comm_handle(handle);
          resp->set_nnodes(nnodes);
          resp->set_first_seq(first_seq);
        }
        reactor->Finish(ToGrpc(st));
      });
  if (!s.ok()) reactor->Finish(ToGrpc(s));
  return reactor;
}

grpc::ServerUnaryReactor* LocalService::Submit(grpc::CallbackServerContext* ctx,
                                               const v1::SubmitRequest* req,
                                               v1::SubmitResponse* resp) {
  auto session = core_->sessions().Find(req->session_id());
  if (!session.ok()) return Done(ctx, session.status());
  absl::StatusOr<uint64_t> seq = core_->submitter().Submit(*session, *req, nullptr);
  if (seq.ok()) resp->set_seq(*seq);
  if (!seq.ok() && IsMoved(seq.status())) {
    // Handed back untaken (a handover): the client submits it again to the new daemon.
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(seq.status().message()),
                                 std::string(kMovedPayload)));
    return reactor;
  }
  return Done(ctx, seq.status());
}

grpc::ServerUnaryReactor* LocalService::OpenRings(grpc::CallbackServerContext* ctx,
                                                  const v1::OpenRingsRequest* req,
                                                  v1::OpenRingsResponse* resp) {
  auto session = core_->sessions().Find(req->session_id());
  if (!session.ok()) return Done(ctx, session.status());
  absl::Status s =
      core_->sessions().OpenRings(*session, req->fd_handle(), req->sq_entries(), req->cq_entries());
  if (s.ok()) {
    resp->set_daemon_spin_us(
        static_cast<uint32_t>(absl::ToInt64Microseconds(core_->config().spin)));
  }
  return Done(ctx, s);
}

grpc::ServerUnaryReactor* LocalService::CommCensus(grpc::CallbackServerContext* ctx,
                                                   const v1::CommCensusRequest* req,
                                                   v1::CommCensusResponse* resp) {
  auto session = core_->sessions().Find(req->session_id());
  if (!session.ok()) return Done(ctx, session.status());
  absl::StatusOr<Membership> m = (*session)->FindMembership(req->comm_handle());
  if (!m.ok()) return Done(ctx, m.status());
  const std::vector<int> exclude(req->exclude().begin(), req->exclude().end());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  core_->peer_plane().Census(m->comm, req->timeout_ms(), exclude,
                             [reactor, resp](const absl::StatusOr<v1::CommCensusResponse>& c) {
                               if (c.ok()) *resp = *c;
                               reactor->Finish(ToGrpc(c.status()));
                             });
  return reactor;
}

grpc::ServerUnaryReactor* LocalService::DestroyComm(grpc::CallbackServerContext* ctx,
                                                    const v1::DestroyCommRequest* req,
                                                    v1::DestroyCommResponse*) {
  auto session = core_->sessions().Find(req->session_id());
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, core_->sessions().DestroyComm(**session, req->comm_handle()));
}

grpc::ServerUnaryReactor* LocalService::Disconnect(grpc::CallbackServerContext* ctx,
                                                   const v1::DisconnectRequest* req,
                                                   v1::DisconnectResponse*) {
  auto session = core_->sessions().Find(req->session_id());
  if (!session.ok()) return Done(ctx, session.status());
  core_->sessions().Close(*session, "client disconnected", grpc::Status::OK);
  return Done(ctx, absl::OkStatus());
}

}  // namespace railyard
