// What this daemon does with the other daemons of the communicators it shares with them, apart
// from building those communicators (DaemonCore's bootstrap) and moving their data (the link
// stacks): heartbeats to every other node of a live multi-node communicator, failing the
// communicators of a node that has not answered for --peer_timeout; answering the other nodes'
// heartbeats, aborts and views of a communicator (Peer.Heartbeat, Peer.AbortComm,
// Peer.GetCommState), each only for another member node; and hang diagnosis (Admin.GetCommState,
// Admin.Diagnose: every member's view, judged by daemon/diagnose/verdicts.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/comm/comm_registry.h"
#include "daemon/comm/communicator.h"
#include "daemon/comm/peer_client.h"
#include "daemon/comm/peer_identity.h"
#include "daemon/diagnose/verdicts.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/session/session_registry.h"
#include "daemon/util/deadline_timer.h"
#include "railyard/v1/admin.pb.h"
#include "railyard/v1/diagnose.pb.h"
#include "railyard/v1/local.pb.h"
#include "railyard/v1/peer.pb.h"

namespace railyard {

class PeerPlane {
 public:
  struct Options {
    std::string node_name;                                 // this daemon, as its peers know it
    absl::Duration heartbeat_interval = absl::Seconds(1);  // --heartbeat_interval
    absl::Duration peer_timeout = absl::Seconds(10);       // --peer_timeout
    // Each heartbeat interval, a running operation whose rail stopped delivering this long fails
    // once the peer confirms it (CheckRails); 0: never.
    absl::Duration rail_stall_timeout = absl::Seconds(60);  // --rail_stall_timeout
  };
  // Everything here must outlive this PeerPlane's Stop() (the daemon's members). metrics may be
  // null (nothing counted); sessions may be null (no pids in the views).
  struct Deps {
    CommRegistry* comms = nullptr;
    SessionRegistry* sessions = nullptr;
    PeerCalls* peers = nullptr;
    DeadlineTimer* timer = nullptr;
    metrics::DaemonMetrics* metrics = nullptr;
  };
  PeerPlane(Options options, Deps deps);
  PeerPlane(const PeerPlane&) = delete;
  PeerPlane& operator=(const PeerPlane&) = delete;

  // Heartbeats start (multi-node daemons, before serving); they stop with Stop(). Idempotent.
  void Start();
  void Stop();

  // A multi-node communicator with these other nodes is being built here (+1) or is registered
  // or failed (-1): their heartbeats are answered meanwhile (they may have built theirs first).
  void CountBuilding(const std::vector<std::string>& nodes, int delta);

  // The daemon `who` asks whether this one is alive. Answered only for a from_node `who` may
  // speak for that is another node of a live multi-node communicator here, or of one being built
  // (else PERMISSION_DENIED: a member that built its side first is refused until this daemon has
  // built its own, which the sender tolerates for --peer_timeout).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const PeerIdentity& who,
                                                  const v1::HeartbeatRequest& req);
  // The daemon `who` reports that a communicator failed there: the communicator fails here with
  // its code (ABORTED for one that is not a status code) and at most 1024 bytes of its message.
  // PERMISSION_DENIED unless `who` may speak for from_node and from_node is another member node
  // of the communicator (the same answer for a communicator this daemon does not have);
  // INVALID_ARGUMENT for a malformed from_node.
  absl::Status AbortFromPeer(const PeerIdentity& who, const v1::AbortCommRequest& req);
  // This daemon's views of its communicators (all, one comm id, or one job's): NOT_FOUND when
  // the filter matches none.
  absl::StatusOr<v1::GetCommStateResponse> GetCommState(const v1::GetCommStateRequest& req);
  // Another member daemon asks for this one's view of a communicator: PERMISSION_DENIED unless
  // `who` may speak for from_node and it is another member node of the communicator here (also
  // for an unknown communicator, so that comm ids cannot be probed).
  absl::StatusOr<v1::CommState> PeerCommState(const PeerIdentity& who,
                                              const v1::PeerCommStateRequest& req);
  // Gathers every member daemon's view of the communicators the request names (in parallel,
  // each within its timeout) and judges them. done runs once, on this thread or another.
  // INVALID_ARGUMENT without comm_id or job_id or for a timeout past 30 s; NOT_FOUND when they
  // name no communicator here.
  void Diagnose(const v1::DiagnoseRequest& req,
                std::function<void(const absl::StatusOr<v1::DiagnoseResponse>&)> done);
  // Which of comm's ranks are gone (Local.CommCensus; daemon/diagnose/census.h): every other
  // member daemon's view within timeout_ms (0: 2 s); with `exclude`, no view but the layout's,
  // those ranks lost. done runs once, on this thread or another. INVALID_ARGUMENT for a timeout
  // past 30 s, an excluded rank out of range, or more excluded ranks than comm has.
  void Census(const std::shared_ptr<Communicator>& comm, uint32_t timeout_ms,
              const std::vector<int>& exclude,
              std::function<void(const absl::StatusOr<v1::CommCensusResponse>&)> done);

 private:
  // One round of heartbeats (the timer runs it every heartbeat_interval after Start).
  void Tick();
  // Asks the peer of a rail comm suspects (Communicator::SuspectRail) for its view and fails the
  // operation when the view confirms the rail stopped delivering (diagnose::rail_check.h).
  void CheckRails(const std::shared_ptr<Communicator>& comm);
  bool SharesCommWith(const std::string& node);
  absl::StatusOr<std::shared_ptr<Communicator>> MemberComm(
      const PeerIdentity& who, absl::string_view rpc, absl::string_view field,
      const std::string& job, const std::string& comm_id, const std::string& from_node);
  // Every member daemon's view of each of comms (this daemon's first; the others asked in
  // parallel, each within timeout), and the nodes that did not answer (or answered for another
  // node index), by communicator. done runs once, on this thread or another.
  using ViewsDone = std::function<void(std::vector<std::vector<v1::CommState>>,
                                       std::vector<std::vector<diagnose::Unanswered>>)>;
  void GatherViews(const std::vector<std::shared_ptr<Communicator>>& comms, absl::Duration timeout,
                   ViewsDone done);
  // comm->ProgressState() with this node's name and its ranks' pids.
  v1::CommState LocalCommState(const std::shared_ptr<Communicator>& comm);

  const Options options_;
  const Deps deps_;
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  DeadlineTimer::Id timer_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Last time each peer daemon (by address) answered a heartbeat, and its last error.
  std::map<std::string, absl::Time> last_seen_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> last_error_ ABSL_GUARDED_BY(mu_);
  // The other nodes of multi-node communicators being built here (by name, how many builds).
  std::map<std::string, int> building_ ABSL_GUARDED_BY(mu_);
  // Communicators (by id) whose rail check waits for the peer's view.
  std::set<std::string> rail_checks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard
