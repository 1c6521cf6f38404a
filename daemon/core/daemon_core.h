// The daemon's core as construction and wiring: it builds the components behind the gRPC
// services and hands each the others it needs, and the services reach them through it:
//   sessions()    SessionPlane   sessions, buffers, rings, memberships     (session_plane.h)
//   submitter()   SubmitPath     every request to its communicator          (submit/submit_path.h)
//   joins()       CommJoins      InitComm, the coordinator's joins, ids     (comm_joins.h)
//   peer_plane()  PeerPlane      heartbeats, peers' aborts, views, diagnose (peer_plane.h)
//   tuning()      Tuning         the cost model, calibrate, explain         (tuning.h)
//   fair_share()  FairShare      paced rails, job weights                    (fair_share.h)
// and, inside, DaemonCommFactory (layout -> communicator, comm_factory.h). What it still does
// itself: the device runtime's set-up, multi-node set-up, Status and the metrics' sample, and
// Shutdown. Threads are stopped explicitly, not by member order: Shutdown stops the joins, the
// peer plane, the rings' threads, the rail queues and the transport; ~DaemonCore then stops the
// submit path's thread and the timer before any member goes. Every method is thread-safe and
// returns errors as absl::Status with a message that says what and why.
#pragma once

#include <cstdint>
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
#include "daemon/comm/peer_client.h"
#include "daemon/config.h"
#include "daemon/core/comm_factory.h"
#include "daemon/core/comm_joins.h"
#include "daemon/core/fair_share.h"
#include "daemon/core/peer_plane.h"
#include "daemon/core/session_plane.h"
#include "daemon/core/tuning.h"
#include "daemon/device/device_runtime.h"
#include "daemon/device/staging_pool.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/scheduler/executor.h"
#include "daemon/session/fd_channel.h"
#include "daemon/session/session.h"
#include "daemon/session/session_registry.h"
#include "daemon/submit/submit_path.h"
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

// The coordinator's bootstrap limits from the daemon's configuration.
inline CommBootstrap::Limits BootstrapLimits(const DaemonConfig& config) {
  CommBootstrap::Limits limits;
  limits.max_pending = config.max_pending_joins;
  limits.max_pending_per_job = config.max_pending_joins_per_job;
  return limits;
}

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
  // This node's topology graph (its --topology file merged with discovery), set before serving;
  // served by Admin.GetTopology.
  void SetNodeGraph(v1::NodeTopology graph);
  v1::NodeTopology NodeGraph();

  // Heartbeats, peers' aborts, communicator views and diagnosis (daemon/core/peer_plane.h).
  PeerPlane& peer_plane() { return peer_plane_; }
  // InitComm, the coordinator's side of joins, comm ids (daemon/core/comm_joins.h).
  CommJoins& joins() { return joins_; }
  // Where every request goes, from Local.Submit and the rings alike (daemon/submit/submit_path.h).
  Submitter& submitter() { return submit_path_; }
  // The buffer side channel the sessions' connections come from (owned by the Server; set
  // before serving).
  void SetFdChannels(FdChannelServer* channels) { session_plane_.SetFdChannels(channels); }
  // Sessions, their buffers, rings and memberships (daemon/core/session_plane.h).
  SessionPlane& sessions() { return session_plane_; }
  size_t session_count() const { return sessions_.Snapshot().size(); }

  // The GPUs this daemon serves device memory on, before serving: a runtime, or why there is
  // none (then device memory is refused with FAILED_PRECONDITION saying so).
  void SetDeviceRuntime(absl::StatusOr<std::unique_ptr<device::DeviceRuntime>> devices);
  // One line for logs and status: the device runtime, or why there is none.
  // How device memory crosses nodes, for DescribeDevices (set when the peer service starts).
  void SetCrossNodeDevicePath(std::string how);
  std::string DescribeDevices() const;

  v1::StatusResponse Status();

  // The cost model communicators coordinated here are handed, railctl calibrate's store and
  // railctl explain (daemon/core/tuning.h).
  Tuning& tuning() { return tuning_; }

  // Fair share on the paced rails: fair queues, job weights, what each job sent
  // (daemon/core/fair_share.h, docs/fair-share.md; railctl jobs).
  FairShare& fair_share() { return fair_share_; }

  // Fails every communicator with CANCELLED and closes every session. Idempotent.
  void Shutdown();
  // railyardd --takeover serves the node now (docs/restarts.md): every communicator finishes the
  // collectives its local ranks all submitted and hands the rest back (MovedStatus), each
  // session's rings are emptied the same way, and once nothing runs (or `drain` passed: what
  // still runs then fails UNAVAILABLE with the sessions) each session hears Moving and ends.
  // Returns how many sessions were handed over.
  // why: what the clients are told (empty: a handover to a new railyardd, --takeover).
  size_t HandOver(absl::Duration drain, std::string why = "");

 private:
  // What the metrics' daemon and job gauges show, sampled at scrape time.
  metrics::DaemonSample SampleMetrics();

  const DaemonConfig config_;
  const absl::Time started_at_;
  // Before everything that updates it (executor threads, communicators, transport callbacks),
  // so that it is destroyed after them.
  const std::unique_ptr<metrics::DaemonMetrics> metrics_;
  // The paced rails' queues and the jobs' weights on them; stopped by Shutdown.
  FairShare fair_share_;
  DeadlineTimer timer_;
  // Before the executor: its workers run device plans on it until they are joined.
  std::unique_ptr<device::DeviceRuntime> devices_;
  // Host buffers for staging device memory across nodes; set with devices_.
  std::unique_ptr<device::StagingPool> staging_pool_;
  absl::Status no_devices_ = absl::FailedPreconditionError("no device runtime was set up");
  mutable absl::Mutex cross_node_mu_;
  std::string cross_node_devices_ ABSL_GUARDED_BY(cross_node_mu_);
  scheduler::Executor executor_;
  CommBootstrap bootstrap_{&timer_, BootstrapLimits(config_)};
  // Before peers_: the answers to its heartbeats come back through peers_, which goes first.
  PeerPlane peer_plane_;
  PeerClients peers_;
  v1::NodeTopology topology_;
  v1::NodeTopology node_graph_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<transport::Transport> transport_;

  absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Sessions and their jobs' tokens; communicators by (job, comm id), their builds and their
  // bootstraps' tag slots. Each has its own lock; neither is called with mu_ held. Declared after
  // the executor and timer their communicators use, so destroyed before them.
  SessionRegistry sessions_;
  CommRegistry comms_;
  // The sessions' ring threads: destroyed (joined) before the sessions and the transport.
  RingPollers ring_pollers_{config_.ring_thread_per_session ? RingPollers::Mode::kPerSession
                                                            : RingPollers::Mode::kPerJob};
  // The cost model (after comms_, which explain reads; it hands models to bootstrap_).
  Tuning tuning_;
  // Builds the communicators ranks join (their links, tuners, failure notices).
  DaemonCommFactory comm_factory_;
  // Ranks joining communicators (uses everything above).
  CommJoins joins_;
  // The submit path (decoding, stream gates, device staging). Its gates' thread submits into
  // communicators and stages on the executor and the devices: ~DaemonCore stops it before any
  // member goes.
  SubmitPath submit_path_;
  // Sessions and what they hold; their rings submit through submit_path_.
  SessionPlane session_plane_;
};

}  // namespace railyard
