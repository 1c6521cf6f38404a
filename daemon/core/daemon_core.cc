#include "daemon/core/daemon_core.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/comm/comm_id.h"
#include "daemon/comm/peer_input.h"
#include "daemon/topology/cpu_affinity.h"
#include "daemon/util/log.h"
#include "daemon/version.h"
#include "proto/railyard/v1/ring.h"

namespace railyard {
namespace {

int WorkerThreads(int configured) {
  if (configured > 0) return configured;
  // The CPUs this process may run on (--cpus, taskset, a cgroup's cpuset), not all of the host's.
  if (absl::StatusOr<std::vector<int>> cpus = AllowedCpus(); cpus.ok() && !cpus->empty()) {
    return static_cast<int>(cpus->size());
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

SubmitPath::Options SubmitOptions(const DaemonConfig& config) {
  SubmitPath::Options o;
  o.op_timeout = config.op_timeout;
  o.staging_chunk_bytes = config.staging_chunk_bytes;
  o.staging_inline_bytes = config.staging_inline_bytes;
  o.staging_pipeline = config.staging_pipeline;
  o.gate_spin = config.spin;
  o.gate_poll = config.stream_poll;
  return o;
}

}  // namespace

DaemonCore::DaemonCore(DaemonConfig config, SessionAuth auth,
                       transport::LinkStack::WireLayer wire_layer)
    : config_(std::move(config)),
      started_at_(absl::Now()),
      metrics_(std::make_unique<metrics::DaemonMetrics>(config_.node_name, kRailyardVersion,
                                                        config_.quotas.max_metric_jobs)),
      fair_share_(config_.job_weights_file, {metrics_.get(), &sessions_, &comms_}),
      executor_(WorkerThreads(config_.worker_threads)),
      peer_plane_({config_.node_name, config_.heartbeat_interval, config_.peer_timeout},
                  {&comms_, &sessions_, &peers_, &timer_, metrics_.get()}),
      sessions_(std::move(auth), &config_.quotas),
      tuning_(config_.state_dir, &comms_,
              [this](const v1::CostModel& model) { bootstrap_.SetCostModel(model); }),
      comm_factory_(config_, {&executor_, &timer_, metrics_.get(), &peers_},
                    transport::LinkStack(std::move(wire_layer))),
      joins_(config_,
             {&comms_, &comm_factory_, &bootstrap_, &peers_, &peer_plane_, &tuning_, &fair_share_}),
      submit_path_(SubmitOptions(config_), &executor_) {
  metrics_->SetSampler([this] { return SampleMetrics(); });
  tuning_.LoadAtStart();
}

DaemonCore::~DaemonCore() {
  Shutdown();
  // The submit path's thread submits into communicators and stages on the executor and devices:
  // it stops before any of them goes (what it still holds fails UNAVAILABLE).
  submit_path_.Stop();
  // A callback running now (a bootstrap's deadline, a heartbeat) finishes before the members it
  // uses are destroyed; none runs after.
  timer_.Stop();
}

absl::StatusOr<std::shared_ptr<Session>> DaemonCore::OpenSession(const v1::ConnectRequest& req) {
  if (req.fd_ticket().empty()) {
    return absl::InvalidArgumentError(
        "Connect needs fd_ticket: connect the buffer side channel <socket>.fd first and pass the "
        "ticket it sends (clients from before buffer descriptors do not)");
  }
  if (fd_channels_ == nullptr) return absl::UnavailableError("the fd side channel is not serving");
  absl::StatusOr<std::shared_ptr<FdChannel>> channel = fd_channels_->Claim(req.fd_ticket());
  if (!channel.ok()) return channel.status();
  const PeerCred cred = (*channel)->cred();
  absl::StatusOr<std::shared_ptr<Session>> session =
      sessions_.Open(req.job_id(), req.token(), cred, req.client());
  if (!session.ok()) {
    (*channel)->Close();
    Log(LogLevel::kWarning, "session", "connect refused",
        {F("job", req.job_id().substr(0, 64)), F("pid", cred.pid), F("uid", cred.uid),
         F("gid", cred.gid), F("reason", session.status().message())});
    return session.status();
  }
  (*session)->AttachFdChannel(*std::move(channel), req.pid());
  metrics_->AddJob((*session)->job());
  Log(LogLevel::kInfo, "session", "connected",
      {F("session", (*session)->id().substr(0, 8)), F("job", (*session)->job()), F("pid", cred.pid),
       F("uid", cred.uid), F("gid", cred.gid), F("reported_pid", req.pid())});
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> DaemonCore::FindSession(const std::string& session_id) {
  return sessions_.Find(session_id);
}

void DaemonCore::CloseSession(const std::shared_ptr<Session>& session, const std::string& why,
                              const grpc::Status& stream_status) {
  if (!sessions_.Remove(session)) return;
  session->Close(stream_status);
  submit_path_.DropHeld(*session, absl::CancelledError("the session has ended"));
  if (std::shared_ptr<SessionRings> rings = session->rings()) rings->Stop();
  if (std::shared_ptr<FdChannel> channel = session->fd_channel()) channel->Close();
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

void DaemonCore::SetDeviceRuntime(absl::StatusOr<std::unique_ptr<device::DeviceRuntime>> devices) {
  if (devices.ok()) {
    devices_ = *std::move(devices);
    staging_pool_ =
        std::make_unique<device::StagingPool>(devices_.get(), config_.staging_cache_bytes);
    submit_path_.SetDevices(devices_.get(), staging_pool_.get());
    no_devices_ = absl::OkStatus();
    executor_.SetDeviceRuntime(devices_.get());
  } else {
    no_devices_ = devices.status();
  }
}

std::string DaemonCore::DescribeDevices() const {
  if (devices_ == nullptr) return std::string(no_devices_.message());
  std::string out = devices_->Describe();
  absl::MutexLock lock(&cross_node_mu_);
  if (!cross_node_devices_.empty()) absl::StrAppend(&out, "; across nodes: ", cross_node_devices_);
  return out;
}

void DaemonCore::SetCrossNodeDevicePath(std::string how) {
  absl::MutexLock lock(&cross_node_mu_);
  cross_node_devices_ = std::move(how);
}

absl::StatusOr<uint64_t> DaemonCore::RegisterBuffer(Session& session, uint64_t fd_handle,
                                                    uint64_t size, v1::MemoryKind memory,
                                                    int device, std::string_view cuda_ipc_handle,
                                                    uint64_t cuda_ipc_offset) {
  const bool ipc = !cuda_ipc_handle.empty();
  absl::StatusOr<UniqueFd> fd = UniqueFd();
  if (ipc) {
    if (fd_handle != 0) {
      return absl::InvalidArgumentError(
          "a buffer comes either as a descriptor (fd_handle) or as a CUDA IPC handle, not both");
    }
    if (memory != v1::MEMORY_KIND_CUDA) {
      return absl::InvalidArgumentError(
          "a CUDA IPC handle names device memory: memory must be "
          "MEMORY_KIND_CUDA");
    }
    if (!config_.cuda_ipc) {
      return absl::FailedPreconditionError(
          "this daemon does not take legacy CUDA IPC handles (--cuda_ipc is off: such a handle "
          "is not bound to the process that made it, so the daemon could not tell whether this "
          "session's process owns the memory): register a VMM allocation exported as a file "
          "descriptor (Client::AllocateDevice, or cuMemCreate with "
          "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), or ask the operator for --cuda_ipc");
    }
  } else {
    std::shared_ptr<FdChannel> channel = session.fd_channel();
    if (channel == nullptr) {
      return absl::FailedPreconditionError("this session has no buffer side channel");
    }
    fd = channel->Take(fd_handle);
    if (!fd.ok()) return fd.status();
  }
  if (size == 0) return absl::InvalidArgumentError("buffer size must be > 0");
  if (memory != v1::MEMORY_KIND_HOST && memory != v1::MEMORY_KIND_CUDA) {
    return absl::InvalidArgumentError(absl::StrCat("memory kind ", static_cast<int>(memory),
                                                   " is not one this daemon knows (host, cuda)"));
  }
  if (memory == v1::MEMORY_KIND_CUDA) {
    if (devices_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("this daemon serves no device memory: ", no_devices_.message()));
    }
    if (devices_->DeviceCount() == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("this daemon serves no device memory: ", devices_->Describe()));
    }
  }
  QuotaCharge count;
  QuotaCharge bytes;
  if (absl::Status s = QuotaCharge::Take(session.quota(), Resource::kBuffers, 1, &count); !s.ok()) {
    return s;
  }
  if (absl::Status s = QuotaCharge::Take(session.quota(), Resource::kBufferBytes, size, &bytes);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::shared_ptr<MappedSegment>> seg;
  if (memory == v1::MEMORY_KIND_CUDA) {
    absl::StatusOr<std::shared_ptr<device::DeviceMapping>> mapping =
        ipc ? devices_->ImportIpc(device, cuda_ipc_handle, cuda_ipc_offset, size,
                                  session.cred().pid)
            : devices_->Import(device, *std::move(fd), size);
    if (mapping.ok()) {
      seg = MappedSegment::FromDevice(*std::move(mapping));
    } else {
      seg = mapping.status();
    }
  } else {
    seg = MappedSegment::MapMemfd(*std::move(fd), size);
  }
  if (!seg.ok()) {
    Log(LogLevel::kWarning, "session", "buffer refused",
        {F("session", session.id().substr(0, 8)), F("job", session.job()), F("pid", session.pid()),
         F("reason", seg.status().message())});
    return seg.status();
  }
  (*seg)->HoldCharges(std::move(count), std::move(bytes));
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

void DaemonCore::SetPeerCredentials(const std::optional<auth::PeerTlsPem>& tls) {
  if (tls.has_value()) {
    peers_.SetTls(tls->ca, tls->cert_chain, tls->private_key);
  } else {
    peers_.SetInsecure();
  }
}

void DaemonCore::EnableMultiNode(v1::NodeTopology topology,
                                 std::unique_ptr<transport::Transport> transport,
                                 std::string peer_address) {
  topology_ = std::move(topology);
  transport_ = std::move(transport);
  joins_.SetFabric(transport_.get(), std::move(peer_address));
  fair_share_.StartRails(topology_);
  comm_factory_.SetFabric(transport_.get(), fair_share_.rail_names(), fair_share_.rail_queues());
  peer_plane_.Start();
}

void DaemonCore::SetNodeGraph(v1::NodeTopology graph) {
  absl::MutexLock lock(&mu_);
  node_graph_ = std::move(graph);
}

v1::NodeTopology DaemonCore::NodeGraph() {
  absl::MutexLock lock(&mu_);
  v1::NodeTopology graph = node_graph_;
  if (graph.node().empty()) graph.set_node(config_.node_name);
  return graph;
}

absl::Status DaemonCore::OpenRings(const std::shared_ptr<Session>& session, uint64_t fd_handle,
                                   uint32_t sq_entries, uint32_t cq_entries) {
  std::shared_ptr<FdChannel> channel = session->fd_channel();
  if (channel == nullptr) {
    return absl::FailedPreconditionError("this session has no buffer side channel");
  }
  absl::StatusOr<UniqueFd> fd = channel->Take(fd_handle);
  if (!fd.ok()) return fd.status();
  if (session->rings() != nullptr) {
    return absl::AlreadyExistsError("this session's rings are open already (one per session)");
  }
  if (!ringproto::ValidEntries(sq_entries) || !ringproto::ValidEntries(cq_entries)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring entries must be powers of two in [", ringproto::kMinEntries, ", ",
        ringproto::kMaxEntries, "], not sq_entries ", sq_entries, " cq_entries ", cq_entries));
  }
  absl::StatusOr<std::shared_ptr<MappedSegment>> seg =
      MappedSegment::MapMemfd(*std::move(fd), ringproto::RingBytes(sq_entries, cq_entries));
  if (!seg.ok()) {
    return absl::Status(seg.status().code(),
                        absl::StrCat("rings memfd refused: ", seg.status().message()));
  }
  absl::StatusOr<std::shared_ptr<SessionRings>> rings =
      SessionRings::Create(*std::move(seg), sq_entries, cq_entries, config_.spin, config_.poll);
  if (!rings.ok()) return rings.status();
  if (absl::Status s = session->AttachRings(*rings); !s.ok()) return s;
  std::weak_ptr<Session> weak = session;
  (*rings)->Start(
      [this, weak](const std::vector<RingSubmission>& entries,
                   const std::shared_ptr<CompletionSink>& sink) {
        std::shared_ptr<Session> s = weak.lock();
        if (s == nullptr || s->closed()) {
          return std::vector<absl::StatusOr<uint64_t>>(
              entries.size(), absl::CancelledError("the session has ended"));
        }
        std::vector<const v1::SubmitRequest*> reqs;
        reqs.reserve(entries.size());
        for (const RingSubmission& e : entries) reqs.push_back(&e.request);
        return submit_path_.SubmitBatch(s, reqs, sink);
      },
      ring_pollers_, session->job(), transport_.get());
  Log(LogLevel::kInfo, "session", "rings open",
      {F("session", session->id().substr(0, 8)), F("job", session->job()),
       F("sq_entries", sq_entries), F("cq_entries", cq_entries)});
  return absl::OkStatus();
}

absl::Status DaemonCore::DestroyComm(Session& session, uint64_t handle) {
  absl::StatusOr<Membership> m = session.FindMembership(handle);
  if (!m.ok()) return m.status();
  session.RemoveMembership(handle);
  // What the rank still had waiting for its stream on this communicator goes with it.
  submit_path_.DropHeld(session, handle,
                        absl::CancelledError(absl::StrCat(
                            "rank ", m->rank, " destroyed communicator ", m->comm->comm_id())));
  m->comm->Leave(m->rank, absl::AbortedError(absl::StrCat(
                              "rank ", m->rank, " destroyed communicator ", m->comm->comm_id())));
  RetireCommIfEmpty(m->comm);
  return absl::OkStatus();
}

void DaemonCore::RetireCommIfEmpty(const std::shared_ptr<Communicator>& comm) {
  if (comm->all_left()) comms_.Retire(comm);
}

metrics::DaemonSample DaemonCore::SampleMetrics() {
  const std::vector<std::shared_ptr<Session>> sessions = sessions_.Snapshot();
  const std::vector<std::shared_ptr<Communicator>> comms = comms_.Snapshot();
  metrics::DaemonSample out;
  out.sessions = static_cast<int>(sessions.size());
  if (staging_pool_ != nullptr) {
    const device::StagingPool::Stats st = staging_pool_->stats();
    out.staging = {st.leased_bytes, st.idle_bytes, st.allocations, st.reuses};
  }
  for (const auto& s : sessions) {
    out.registered_buffer_bytes += s->buffer_bytes();
    out.jobs[s->job()];  // a connected job shows up with zero comms
  }
  for (const auto& c : comms) {
    const CommStats st = c->Stats();
    if (st.state == "failed") continue;
    ++out.communicators;
    metrics::JobSample& j = out.jobs[st.job];
    ++j.comms;
    j.queued_ops += static_cast<int>(st.queued_ops);
    j.in_flight_ops += static_cast<int>(st.in_flight_ops);
    j.pending_collectives += static_cast<int>(st.pending_collectives);
    j.stalled_seconds = std::max(j.stalled_seconds, absl::ToDoubleSeconds(st.oldest_pending));
  }
  for (auto& [job, j] : out.jobs) j.weight = fair_share_.Weight(job);
  for (const auto& [job, e] : fair_share_.Weights()) out.job_weights[job] = e.weight;
  return out;
}

v1::StatusResponse DaemonCore::Status() {
  v1::StatusResponse out;
  out.set_version(kRailyardVersion);
  out.set_data_plane_version(kDataPlaneVersion);
  out.set_devices(DescribeDevices());
  out.set_ops_held_for_streams(submit_path_.held());
  out.set_node_name(config_.node_name);
  out.set_socket(config_.socket);
  out.set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_at_));
  out.set_worker_threads(static_cast<uint32_t>(executor_.threads()));
  out.set_peer_address(joins_.peer_address());
  out.set_chunk_bytes(config_.chunk_bytes);
  out.set_paced_chunk_bytes(fair_share_.PacedChunkBytes());
  for (const auto& rail : topology_.rails()) {
    out.add_rails(rail.device().empty() ? rail.name()
                                        : absl::StrCat(rail.name(), "@", rail.device()));
  }
  const std::vector<std::shared_ptr<Session>> sessions = sessions_.Snapshot();
  const std::vector<std::shared_ptr<Communicator>> comms = comms_.Snapshot();
  auto [ops_completed, ops_failed] = comms_.retired_ops();
  std::map<std::string, v1::JobStatus> jobs;
  uint64_t buffers = 0;
  uint64_t buffer_bytes = 0;
  for (const auto& s : sessions) {
    auto* ss = out.add_sessions();
    ss->set_session_id_prefix(s->id().substr(0, 8));
    ss->set_job_id(s->job());
    ss->set_pid(s->pid());
    ss->set_uid(s->cred().uid);
    ss->set_gid(s->cred().gid);
    ss->set_reported_pid(s->reported_pid());
    ss->set_client(s->client());
    ss->set_buffers(s->buffer_count());
    ss->set_buffer_bytes(s->buffer_bytes());
    if (std::shared_ptr<SessionRings> rings = s->rings()) {
      const RingStats rs = rings->stats();
      ss->set_rings(true);
      ss->set_ring_submitted(rs.submitted);
      ss->set_ring_refused(rs.refused);
      ss->set_ring_completed(rs.completed);
      ss->set_ring_client_wakes(rs.client_wakes);
    }
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
    cs->set_ops_fused(st.ops_fused);
    cs->set_nnodes(st.nnodes);
    ops_completed += st.ops_completed;
    ops_failed += st.ops_failed;
    v1::JobStatus& j = jobs[st.job];
    j.set_job_id(st.job);
    j.set_comms(j.comms() + 1);
  }
  for (auto& [name, j] : jobs) {
    j.set_weight(fair_share_.Weight(name));
    *out.add_jobs() = j;
  }
  out.set_buffers(static_cast<uint32_t>(buffers));
  out.set_buffer_bytes(buffer_bytes);
  out.set_ops_completed(ops_completed);
  out.set_ops_failed(ops_failed);
  return out;
}

void DaemonCore::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
  }
  joins_.Shutdown();
  peer_plane_.Stop();
  // Entries a client published before now are taken first: they are in flight, and fail
  // CANCELLED with the rest below rather than vanish with the session.
  for (auto& s : sessions_.Snapshot()) {
    if (std::shared_ptr<SessionRings> rings = s->rings()) rings->Quiesce();
  }
  bootstrap_.Shutdown(absl::UnavailableError("railyardd is shutting down"));
  for (auto& comm : comms_.Close()) {
    comm->Abort(absl::CancelledError("railyardd is shutting down"));
  }
  for (auto& s : sessions_.Close()) {
    CloseSession(s, "railyardd is shutting down",
                 grpc::Status(grpc::StatusCode::UNAVAILABLE, "railyardd is shutting down"));
  }
  ring_pollers_.StopAll();
  // Sends still queued on a paced rail go out now (and fail: their communicators are aborted).
  fair_share_.Shutdown();
  if (transport_ != nullptr) transport_->Shutdown();
}

}  // namespace railyard
