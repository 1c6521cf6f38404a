#include "daemon/daemon_core.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/comm_id.h"
#include "daemon/job_tokens.h"
#include "daemon/log.h"
#include "daemon/request_decode.h"
#include "daemon/version.h"

namespace railyard {
namespace {

constexpr int kMaxRanks = 1 << 16;

int WorkerThreads(int configured) {
  if (configured > 0) return configured;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace

DaemonCore::DaemonCore(DaemonConfig config, std::map<std::string, std::string> job_tokens)
    : config_(std::move(config)),
      fixed_tokens_(std::move(job_tokens)),
      started_at_(absl::Now()),
      executor_(WorkerThreads(config_.worker_threads)) {
  coordinator_ =
      config_.peer_listen.empty() ? absl::StrCat("local:", config_.node_name) : config_.peer_listen;
}

DaemonCore::~DaemonCore() { Shutdown(); }

absl::StatusOr<std::shared_ptr<Session>> DaemonCore::OpenSession(const v1::ConnectRequest& req) {
  if (!ValidJobId(req.job_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id '", req.job_id().substr(0, 64), "' is not [A-Za-z0-9._-]{1,128}"));
  }
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("railyardd is shutting down");
  if (!fixed_tokens_.empty()) {
    auto it = fixed_tokens_.find(req.job_id());
    if (it == fixed_tokens_.end()) {
      return absl::PermissionDeniedError(
          absl::StrCat("job ", req.job_id(), " is not listed in this daemon's job tokens file"));
    }
    if (it->second != req.token()) {
      return absl::PermissionDeniedError(absl::StrCat("wrong token for job ", req.job_id()));
    }
  }
  auto [job_it, inserted] = jobs_.try_emplace(req.job_id());
  Job& job = job_it->second;
  if (inserted) {
    job.token = req.token();
  } else if (job.token != req.token()) {
    return absl::PermissionDeniedError(
        absl::StrCat("wrong token for job ", req.job_id(),
                     ": it does not match the token its first session set"));
  }
  ++job.sessions;
  auto session = std::make_shared<Session>(RandomHex128(), req.job_id(), req.pid(),
                                           req.client().substr(0, 128));
  sessions_.emplace(session->id(), session);
  Log(LogLevel::kInfo, "session", "connected",
      {F("session", session->id().substr(0, 8)), F("job", session->job()), F("pid", req.pid())});
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> DaemonCore::FindSession(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError("unknown session id: connect first (or the session has ended)");
  }
  return it->second;
}

void DaemonCore::CloseSession(const std::shared_ptr<Session>& session, const std::string& why,
                              const grpc::Status& stream_status) {
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session->id());
    if (it == sessions_.end() || it->second != session) return;
    sessions_.erase(it);
    auto job = jobs_.find(session->job());
    if (job != jobs_.end() && --job->second.sessions == 0) jobs_.erase(job);
  }
  session->Close(stream_status);
  const auto buffers = session->TakeBuffers();  // unmapped when the last operation lets go
  for (auto& [handle, m] : session->TakeMemberships()) {
    m.comm->Leave(m.rank, absl::UnavailableError(absl::StrCat("rank ", m.rank, " of communicator ",
                                                              m.comm->comm_id(), " (pid ",
                                                              session->pid(), ") left: ", why)));
    RetireCommIfEmpty(m.comm);
  }
  Log(LogLevel::kInfo, "session", "closed",
      {F("session", session->id().substr(0, 8)), F("job", session->job()), F("pid", session->pid()),
       F("reason", why), F("buffers_released", buffers.size())});
}

absl::StatusOr<uint64_t> DaemonCore::RegisterBuffer(Session& session, const std::string& shm_name,
                                                    uint64_t size) {
  absl::StatusOr<std::shared_ptr<MappedSegment>> seg = MappedSegment::Map(shm_name, size);
  if (!seg.ok()) return seg.status();
  const uint64_t id = next_buffer_id_.fetch_add(1);
  if (absl::Status s = session.AddBuffer(id, *std::move(seg)); !s.ok()) return s;
  return id;
}

absl::Status DaemonCore::ReleaseBuffer(Session& session, uint64_t buffer_id) {
  if (!session.RemoveBuffer(buffer_id)) {
    return absl::NotFoundError(
        absl::StrCat("buffer ", buffer_id, " is not registered in this session"));
  }
  return absl::OkStatus();
}

std::string DaemonCore::NewCommId() { return FormatCommId({RandomHex128(), coordinator_}); }

absl::Status DaemonCore::InitComm(const std::shared_ptr<Session>& session,
                                  const v1::InitCommRequest& req, InitDone done) {
  absl::StatusOr<CommId> id = ParseCommId(req.comm_id());
  if (!id.ok()) return id.status();
  if (id->coordinator != coordinator_) {
    return absl::UnimplementedError(absl::StrCat(
        "comm id names coordinator ", id->coordinator, " but this daemon is ", coordinator_,
        ": communicators spanning several daemons need the multi-node peer service"));
  }
  if (req.nranks() < 1 || req.nranks() > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("nranks ", req.nranks(), " not in [1, ", kMaxRanks, "]"));
  }
  if (req.rank() < 0 || req.rank() >= req.nranks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", req.rank(), " not in [0, ", req.nranks(), ")"));
  }
  std::shared_ptr<Communicator> comm;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("railyardd is shutting down");
    auto key = std::make_pair(session->job(), req.comm_id());
    auto it = comms_.find(key);
    if (it != comms_.end() && it->second->failed()) {
      // A failed communicator is never revived: a new one takes over its id.
      comms_.erase(it);
      it = comms_.end();
    }
    if (it == comms_.end()) {
      CommEnv env{&executor_, &timer_, config_.chunk_bytes, config_.op_timeout,
                  config_.init_timeout};
      comm = std::make_shared<Communicator>(req.comm_id(), session->job(), req.nranks(), env);
      comms_.emplace(key, comm);
    } else {
      comm = it->second;
      if (comm->nranks() != req.nranks()) {
        return absl::InvalidArgumentError(absl::StrCat("communicator ", req.comm_id(), " has ",
                                                       comm->nranks(), " ranks, rank ", req.rank(),
                                                       " asked for ", req.nranks()));
      }
    }
  }
  const uint64_t handle = next_comm_handle_.fetch_add(1);
  if (absl::Status s = session->AddMembership(handle, {comm, req.rank()}); !s.ok()) return s;
  const absl::Duration timeout =
      req.timeout_ms() > 0 ? absl::Milliseconds(req.timeout_ms()) : config_.init_timeout;
  std::weak_ptr<Session> weak_session = session;
  absl::Status s =
      comm->Join(req.rank(), timeout, [done, handle, weak_session](const absl::Status& status) {
        if (!status.ok()) {
          if (auto sess = weak_session.lock()) sess->RemoveMembership(handle);
        }
        done(status, handle);
      });
  if (!s.ok()) {
    session->RemoveMembership(handle);
    RetireCommIfEmpty(comm);
    return s;
  }
  Log(LogLevel::kDebug, "comm", "rank joined",
      {F("comm", req.comm_id()), F("rank", req.rank()), F("nranks", req.nranks())});
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> DaemonCore::Submit(const std::shared_ptr<Session>& session,
                                            const v1::SubmitRequest& req) {
  absl::StatusOr<Membership> m = session->FindMembership(req.comm_handle());
  if (!m.ok()) return m.status();
  absl::StatusOr<std::unique_ptr<PendingRequest>> pending =
      DecodeSubmit(req, *session, m->rank, m->comm->nranks());
  if (!pending.ok()) return pending.status();
  (*pending)->session = session;
  return m->comm->Submit(*std::move(pending));
}

absl::Status DaemonCore::DestroyComm(Session& session, uint64_t handle) {
  absl::StatusOr<Membership> m = session.FindMembership(handle);
  if (!m.ok()) return m.status();
  session.RemoveMembership(handle);
  m->comm->Leave(m->rank, absl::AbortedError(absl::StrCat(
                              "rank ", m->rank, " destroyed communicator ", m->comm->comm_id())));
  RetireCommIfEmpty(m->comm);
  return absl::OkStatus();
}

void DaemonCore::RetireCommIfEmpty(const std::shared_ptr<Communicator>& comm) {
  if (!comm->all_left()) return;
  const CommStats stats = comm->Stats();
  absl::MutexLock lock(&mu_);
  auto it = comms_.find({comm->job(), comm->comm_id()});
  if (it == comms_.end() || it->second != comm) return;
  retired_ops_completed_ += stats.ops_completed;
  retired_ops_failed_ += stats.ops_failed;
  comms_.erase(it);
}

v1::StatusResponse DaemonCore::Status() {
  v1::StatusResponse out;
  out.set_version(kRailyardVersion);
  out.set_node_name(config_.node_name);
  out.set_socket(config_.socket);
  out.set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_at_));
  out.set_worker_threads(static_cast<uint32_t>(executor_.threads()));
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<std::shared_ptr<Communicator>> comms;
  uint64_t ops_completed = 0;
  uint64_t ops_failed = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) sessions.push_back(s);
    for (const auto& [key, c] : comms_) comms.push_back(c);
    ops_completed = retired_ops_completed_;
    ops_failed = retired_ops_failed_;
  }
  std::map<std::string, v1::JobStatus> jobs;
  uint64_t buffers = 0;
  uint64_t buffer_bytes = 0;
  for (const auto& s : sessions) {
    auto* ss = out.add_sessions();
    ss->set_session_id_prefix(s->id().substr(0, 8));
    ss->set_job_id(s->job());
    ss->set_pid(s->pid());
    ss->set_client(s->client());
    ss->set_buffers(s->buffer_count());
    ss->set_buffer_bytes(s->buffer_bytes());
    ss->set_connected_seconds(absl::ToDoubleSeconds(absl::Now() - s->connected_at()));
    v1::JobStatus& j = jobs[s->job()];
    j.set_job_id(s->job());
    j.set_sessions(j.sessions() + 1);
    j.set_buffers(j.buffers() + ss->buffers());
    j.set_buffer_bytes(j.buffer_bytes() + ss->buffer_bytes());
    buffers += ss->buffers();
    buffer_bytes += ss->buffer_bytes();
  }
  for (const auto& c : comms) {
    const CommStats st = c->Stats();
    auto* cs = out.add_comms();
    cs->set_comm_id(st.comm_id);
    cs->set_job_id(st.job);
    cs->set_nranks(st.nranks);
    cs->set_joined_ranks(st.joined);
    cs->set_state(st.state);
    cs->set_error(st.error);
    cs->set_ops_completed(st.ops_completed);
    cs->set_ops_failed(st.ops_failed);
    cs->set_bytes_reduced(st.bytes_moved);
    ops_completed += st.ops_completed;
    ops_failed += st.ops_failed;
    v1::JobStatus& j = jobs[st.job];
    j.set_job_id(st.job);
    j.set_comms(j.comms() + 1);
  }
  for (auto& [name, j] : jobs) *out.add_jobs() = j;
  out.set_buffers(static_cast<uint32_t>(buffers));
  out.set_buffer_bytes(buffer_bytes);
  out.set_ops_completed(ops_completed);
  out.set_ops_failed(ops_failed);
  return out;
}

void DaemonCore::Shutdown() {
  std::map<std::string, std::shared_ptr<Session>> sessions;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<Communicator>> comms;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    sessions = sessions_;
    comms = comms_;
  }
  for (auto& [key, comm] : comms) {
    comm->Abort(absl::CancelledError("railyardd is shutting down"));
  }
  for (auto& [id, s] : sessions) {
    CloseSession(s, "railyardd is shutting down",
                 grpc::Status(grpc::StatusCode::UNAVAILABLE, "railyardd is shutting down"));
  }
}

}  // namespace railyard
