// The daemon's state behind the gRPC services: sessions, jobs and their tokens, buffers,
// communicators. Every method is thread-safe and returns errors as absl::Status with a message
// that says what and why; none blocks on another client.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/auth/peer_tls.h"
#include "daemon/comm/bootstrap.h"
#include "daemon/comm/comm_registry.h"
#include "daemon/comm/communicator.h"
#include "daemon/comm/peer_client.h"
#include "daemon/comm/peer_identity.h"
#include "daemon/config.h"
#include "daemon/core/comm_factory.h"
#include "daemon/core/peer_plane.h"
#include "daemon/device/device_runtime.h"
#include "daemon/device/staging_pool.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/tags.h"
#include "daemon/session/fd_channel.h"
#include "daemon/session/job_weights.h"
#include "daemon/session/session.h"
#include "daemon/session/session_registry.h"
#include "daemon/session/session_rings.h"
#include "daemon/submit/device_staging.h"
#include "daemon/submit/stream_gates.h"
#include "daemon/submit/submit_path.h"
#include "daemon/transport/fair_queue.h"
#include "daemon/transport/link_stack.h"
#include "daemon/transport/transport.h"
#include "daemon/util/deadline_timer.h"
#include "railyard/v1/admin.pb.h"
#include "railyard/v1/cost.pb.h"
#include "railyard/v1/diagnose.pb.h"
#include "railyard/v1/local.pb.h"
#include "railyard/v1/peer.pb.h"
#include "railyard/v1/topology.pb.h"

namespace railyard {

class DaemonCore {
 public:
  // auth: who may connect as which job (the Server loads it from the config's files);
  // wire_layer: what wraps every link's wire endpoint (test builds' fault injection; null: none).
  DaemonCore(DaemonConfig config, SessionAuth auth,
             transport::LinkStack::WireLayer wire_layer = nullptr);
  ~DaemonCore();

  const DaemonConfig& config() const { return config_; }
  // This daemon's metric families (served by the Server when --metrics_listen is set).
  metrics::DaemonMetrics& metrics() { return *metrics_; }

  // The peer plane's client credentials, before EnableMultiNode: mutual TLS with this daemon's
  // certificate, key and the cluster CA, or plaintext (nullopt: --peer_insecure).
  void SetPeerCredentials(const std::optional<auth::PeerTlsPem>& tls);
  // Multi-node set-up, before serving: the rails of this node, the transport over them and the
  // address other daemons reach this one's Peer service at (empty: single-node only).
  void EnableMultiNode(v1::NodeTopology topology, std::unique_ptr<transport::Transport> transport,
                       std::string peer_address);
  // This daemon as other daemons see it.
  v1::NodeInfo MyNodeInfo();
  // This node's topology graph (its --topology file merged with discovery), set before serving;
  // served by Admin.GetTopology.
  void SetNodeGraph(v1::NodeTopology graph);
  v1::NodeTopology NodeGraph();

  // Coordinator side of communicator bootstrap (Peer.JoinComm from the daemon `who`, or a local
  // rank's InitComm with PeerIdentity::Self()). Everything is checked before anything is stored
  // (CheckJoinRequest: INVALID_ARGUMENT naming the field, PERMISSION_DENIED when `who` may not
  // speak for the node), then CommBootstrap::Join (PERMISSION_DENIED for a comm id of another
  // job, RESOURCE_EXHAUSTED past --max_pending_joins); it waits at most --join_timeout.
  absl::Status CoordinateJoin(const PeerIdentity& who, const v1::JoinCommRequest& req,
                              CommBootstrap::Done done);
  // Heartbeats, peers' aborts, communicator views and diagnosis (daemon/core/peer_plane.h).
  PeerPlane& peer_plane() { return peer_plane_; }
  // Name written into comm ids as coordinator.
  const std::string& coordinator() const { return coordinator_; }

  // The buffer side channel the sessions' connections come from (owned by the Server; set
  // before serving).
  void SetFdChannels(FdChannelServer* channels) { fd_channels_ = channels; }

  // Binds the side channel named by req.fd_ticket and opens a session as the process the kernel
  // says is at its end. INVALID_ARGUMENT for a malformed job id or no fd_ticket, NOT_FOUND for an
  // unknown ticket, PERMISSION_DENIED (token, uid policy), RESOURCE_EXHAUSTED (session limits),
  // UNAVAILABLE when shutting down.
  absl::StatusOr<std::shared_ptr<Session>> OpenSession(const v1::ConnectRequest& req);
  // NOT_FOUND for an unknown (or closed) session id.
  absl::StatusOr<std::shared_ptr<Session>> FindSession(const std::string& session_id);
  // Ends a session: unmaps its buffers, leaves its communicators (failing them for their other
  // ranks with `why`), finishes its stream with `stream_status`. Idempotent.
  void CloseSession(const std::shared_ptr<Session>& session, const std::string& why,
                    const grpc::Status& stream_status);

  // The GPUs this daemon serves device memory on, before serving: a runtime, or why there is
  // none (then device memory is refused with FAILED_PRECONDITION saying so).
  void SetDeviceRuntime(absl::StatusOr<std::unique_ptr<device::DeviceRuntime>> devices);
  // One line for logs and status: the device runtime, or why there is none.
  // How device memory crosses nodes, for DescribeDevices (set when the peer service starts).
  void SetCrossNodeDevicePath(std::string how);
  std::string DescribeDevices() const;

  // Maps the memfd the session's side channel holds under fd_handle (one time), within the
  // session's and job's buffer quotas. With memory MEMORY_KIND_CUDA the descriptor is a device
  // allocation to import on `device` (device::DeviceRuntime::Import says what it checks);
  // FAILED_PRECONDITION when this daemon has no devices, INVALID_ARGUMENT for an unknown kind.
  // A non-empty cuda_ipc_handle instead of a descriptor (fd_handle 0): legacy CUDA IPC, device
  // memory at cuda_ipc_offset of that allocation (DeviceRuntime::ImportIpc), only with
  // --cuda_ipc (FAILED_PRECONDITION saying why otherwise).
  absl::StatusOr<uint64_t> RegisterBuffer(Session& session, uint64_t fd_handle, uint64_t size,
                                          v1::MemoryKind memory = v1::MEMORY_KIND_HOST,
                                          int device = -1, std::string_view cuda_ipc_handle = {},
                                          uint64_t cuda_ipc_offset = 0);
  absl::Status ReleaseBuffer(Session& session, uint64_t buffer_id);

  std::string NewCommId();

  // handle: the rank's communicator handle; nnodes: the daemons the communicator spans (0 on
  // error).
  using InitDone = std::function<void(const absl::Status&, uint64_t handle, int nnodes)>;
  // Joins a communicator; done runs once every rank has joined or the join failed. Errors found
  // at once are returned and done is not called.
  absl::Status InitComm(const std::shared_ptr<Session>& session, const v1::InitCommRequest& req,
                        InitDone done);
  // Where every request goes, from Local.Submit and the rings alike (daemon/submit/submit_path.h).
  Submitter& submitter() { return submit_path_; }
  // Maps the rings memfd the session's side channel holds under fd_handle and starts serving
  // them (Local.OpenRings).
  absl::Status OpenRings(const std::shared_ptr<Session>& session, uint64_t fd_handle,
                         uint32_t sq_entries, uint32_t cq_entries);
  absl::Status DestroyComm(Session& session, uint64_t handle);

  v1::StatusResponse Status();

  // The cost model communicators coordinated here are handed (daemon_core_tuning.cc): the
  // calibration stored under --state_dir, else the built-in defaults.
  v1::CostModel CostModel();
  // Validates, persists (<state_dir>/calibration.json) and uses a new calibration for the
  // communicators created from now on; returns the file's path.
  absl::StatusOr<std::string> SetCalibration(const v1::CostModel& model);
  // railctl explain: the candidates a multi-node communicator weighs for an operation.
  absl::StatusOr<v1::ExplainResponse> Explain(const v1::ExplainRequest& req);

  // Fair share on the paced rails (daemon_core_jobs.cc, docs/fair-share.md): the weights of
  // --job_weights, loaded at start (an error stops the daemon) and on SIGHUP (an error keeps the
  // weights it had, and is logged); railctl jobs.
  absl::Status LoadJobWeights();
  void ReloadJobWeights();
  v1::ListJobsResponse ListJobs();
  absl::StatusOr<double> SetJobWeight(const std::string& job, double weight);
  double JobWeight(const std::string& job) const { return job_weights_.Get(job); }

  // Fails every communicator with CANCELLED and closes every session. Idempotent.
  void Shutdown();

 private:
  // One FairQueue per rail with a `pace` (EnableMultiNode, before any communicator exists).
  void StartRailQueues();
  // NodeInfo.paced_chunk_bytes: the power of two at or below 2.5 ms at the slowest paced rail's
  // rate, within [kMinPacedChunkBytes, 4 MiB]; 0 without a paced rail.
  uint64_t PacedChunkBytes() const;
  // A send leaving rail's fair queue (on the thread that issues it).
  void RecordRailSend(int rail, const std::string& job, size_t bytes, double waited_s);
  void RetireCommIfEmpty(const std::shared_ptr<Communicator>& comm);
  // A join's wait for the other ranks: the request's, else --init_timeout; never more than
  // --join_timeout.
  absl::Duration JoinTimeout(uint32_t timeout_ms) const;
  // A rank's layout arrived from the coordinator: find or build this node's communicator and join.
  // Builds the communicator outside mu_ (UCX connects may take --peer_timeout per peer and
  // rail): the first rank to get the layout builds it, the others wait for it without blocking.
  void OnLayout(const std::weak_ptr<Session>& session, const v1::InitCommRequest& req,
                uint64_t handle, std::shared_ptr<const scheduler::tags::Slot> slot,
                const absl::StatusOr<v1::JoinCommResponse>& layout, InitDone done);
  // Joins the rank to the communicator built (or found) for its layout.
  void JoinBuilt(const std::weak_ptr<Session>& session, const v1::InitCommRequest& req,
                 uint64_t handle, int nnodes,
                 const absl::StatusOr<std::shared_ptr<Communicator>>& comm, InitDone done);
  // Reads <state_dir>/calibration.json at start (defaults when absent or unreadable).
  void LoadCalibrationAtStart();
  // What the metrics' daemon and job gauges show, sampled at scrape time.
  metrics::DaemonSample SampleMetrics();

  const DaemonConfig config_;
  const absl::Time started_at_;
  // Before everything that updates it (executor threads, communicators, transport callbacks),
  // so that it is destroyed after them.
  const std::unique_ptr<metrics::DaemonMetrics> metrics_;
  // Read by the rail queues' threads (weights, per-job send totals): declared before them.
  JobWeights job_weights_;
  struct RailShare {
    uint64_t bytes = 0;
    uint64_t sends = 0;
    double delay_total_s = 0;
    double delay_max_s = 0;
  };
  absl::Mutex shares_mu_;
  std::map<std::pair<std::string, int>, RailShare> shares_ ABSL_GUARDED_BY(shares_mu_);
  std::string coordinator_;
  DeadlineTimer timer_;
  // Before the executor: its workers run device plans on it until they are joined.
  std::unique_ptr<device::DeviceRuntime> devices_;
  // Host buffers for staging device memory across nodes; set with devices_.
  std::unique_ptr<device::StagingPool> staging_pool_;
  absl::Status no_devices_ = absl::FailedPreconditionError("no device runtime was set up");
  mutable absl::Mutex cross_node_mu_;
  std::string cross_node_devices_ ABSL_GUARDED_BY(cross_node_mu_);
  scheduler::Executor executor_;
  CommBootstrap bootstrap_{&timer_, {config_.max_pending_joins}};
  // Before peers_: the answers to its heartbeats come back through peers_, which goes first.
  PeerPlane peer_plane_;
  PeerClients peers_;
  v1::NodeTopology topology_;
  v1::NodeTopology node_graph_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<transport::Transport> transport_;
  // By rail; null for an unpaced rail. Set once by EnableMultiNode, before communicators exist;
  // destroyed before the transport (Shutdown stops them first).
  std::vector<std::shared_ptr<transport::FairQueue>> rail_queues_;
  std::vector<std::string> rail_names_;
  std::string peer_address_;
  FdChannelServer* fd_channels_ = nullptr;
  std::atomic<uint64_t> next_buffer_id_{1};
  std::atomic<uint64_t> next_comm_handle_{1};

  absl::Mutex mu_;
  v1::CostModel cost_model_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Sessions and their jobs' tokens; communicators by (job, comm id), their builds and their
  // bootstraps' tag slots. Each has its own lock; neither is called with mu_ held. Declared after
  // the executor and timer their communicators use, so destroyed before them.
  SessionRegistry sessions_;
  CommRegistry comms_;
  // The sessions' ring threads: destroyed (joined) before the sessions and the transport.
  RingPollers ring_pollers_{config_.ring_thread_per_session ? RingPollers::Mode::kPerSession
                                                            : RingPollers::Mode::kPerJob};
  // Builds the communicators ranks join (their links, tuners, failure notices).
  DaemonCommFactory comm_factory_;
  // The submit path (decoding, stream gates, device staging). Its gates' thread submits into
  // communicators and stages on the executor and the devices: ~DaemonCore stops it first.
  SubmitPath submit_path_;
};

}  // namespace railyard
