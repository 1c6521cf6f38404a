#include "daemon/core/daemon_core.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/comm/peer_input.h"  // kDataPlaneVersion
#include "daemon/session/session_rings.h"
#include "daemon/topology/cpu_affinity.h"
#include "daemon/util/log.h"
#include "daemon/version.h"

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
  o.held.per_session = config.max_held_ops_per_session;
  o.held.per_job = config.max_held_ops_per_job;
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
      peer_plane_({config_.node_name, config_.heartbeat_interval, config_.peer_timeout,
                   config_.rail_stall_timeout},
                  {&comms_, &sessions_, &peers_, &timer_, metrics_.get()}),
      sessions_(std::move(auth), &config_.quotas),
      tuning_(config_.state_dir, &comms_,
              [this](const v1::CostModel& model) { bootstrap_.SetCostModel(model); }),
      comm_factory_(config_, {&executor_, &timer_, metrics_.get(), &peers_},
                    transport::LinkStack(std::move(wire_layer))),
      joins_(config_,
             {&comms_, &comm_factory_, &bootstrap_, &peers_, &peer_plane_, &tuning_, &fair_share_}),
      submit_path_(SubmitOptions(config_), &executor_),
      session_plane_(config_,
                     {&sessions_, &comms_, &submit_path_, &ring_pollers_, metrics_.get()}) {
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
  session_plane_.SetDevices(devices_.get(), no_devices_);
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
  session_plane_.SetTransport(transport_.get());
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
      ss->set_ring_daemon_wakeups(rs.wakeups);
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

size_t DaemonCore::HandOver(absl::Duration drain, std::string why) {
  if (why.empty()) why = "railyardd is handing this node over to a new railyardd (--takeover)";
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return 0;
  }
  const absl::Time started = absl::Now();
  // Joins in progress fail (UNAVAILABLE): their clients join again on the new daemon.
  joins_.Shutdown();
  for (auto& comm : comms_.Snapshot()) comm->BeginHandover(why);
  // What the clients had published is taken now and handed back by the communicators.
  for (auto& s : sessions_.Snapshot()) {
    if (std::shared_ptr<SessionRings> rings = s->rings()) rings->Quiesce();
  }
  const absl::Time deadline = started + drain;
  size_t running = 0;
  while (true) {
    running = 0;
    for (auto& comm : comms_.Snapshot()) running += comm->idle() ? 0 : 1;
    if (running == 0 || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  const std::vector<std::shared_ptr<Session>> sessions = sessions_.Snapshot();
  for (auto& s : sessions) {
    s->SendMoving(why, kRailyardVersion);
    session_plane_.Close(s, why, grpc::Status::OK);
  }
  Log(running == 0 ? LogLevel::kInfo : LogLevel::kWarning, "handover", "sessions handed over",
      {F("sessions", sessions.size()), F("still_running", running),
       F("drain_ms", absl::ToInt64Milliseconds(absl::Now() - started))});
  return sessions.size();
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
    session_plane_.Close(s, "railyardd is shutting down",
                         grpc::Status(grpc::StatusCode::UNAVAILABLE, "railyardd is shutting down"));
  }
  ring_pollers_.StopAll();
  // Sends still queued on a paced rail go out now (and fail: their communicators are aborted).
  fair_share_.Shutdown();
  if (transport_ != nullptr) transport_->Shutdown();
}

}  // namespace railyard
