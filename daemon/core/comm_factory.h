// Communicators from their layouts: a one-node communicator for a job's local ranks, and this
// node's side of a multi-node one from its coordinator's layout (JoinCommResponse): a link to
// every other node on every rail, each the transport's endpoint layered by transport::LinkStack
// (framing with the communicator's secret and integrity, link metrics, the rail's fair queue), its
// tuner from the coordinator's cost model, and who to tell when it fails (Peer.AbortComm to
// every other node).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/comm/communicator.h"
#include "daemon/comm/peer_client.h"
#include "daemon/config.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/scheduler/cost/tuner.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/tags.h"
#include "daemon/transport/fair_queue.h"
#include "daemon/transport/integrity.h"
#include "daemon/transport/link_stack.h"
#include "daemon/transport/transport.h"
#include "daemon/util/deadline_timer.h"
#include "railyard/v1/cost.pb.h"
#include "railyard/v1/peer.pb.h"

namespace railyard {

// The stronger of the daemon's --integrity and a rank's request ("" leaves the daemon's):
// INVALID_ARGUMENT naming InitComm's integrity for a request that is neither.
absl::StatusOr<transport::Integrity> AskedIntegrity(const std::string& daemon,
                                                    const std::string& rank);

// What builds the communicators a daemon's ranks join (a fake in tests of what joins them).
class CommFactory {
 public:
  virtual ~CommFactory() = default;
  // A communicator of nranks ranks, all on this node.
  virtual std::shared_ptr<Communicator> MakeLocal(const std::string& job,
                                                  const std::string& comm_id, int nranks,
                                                  const v1::CostModel& model) = 0;
  // This node's side (node my_node of the layout, which CheckLayoutFromCoordinator has checked)
  // of a multi-node communicator, connected to every other node on every rail. slot: the tag slot
  // this daemon announced for it (the layout must carry it). asked_integrity: what the joining
  // rank asked for ("" leaves the daemon's). FAILED_PRECONDITION without a transport or for a
  // layout this node cannot use; INVALID_ARGUMENT for a slot not its own or a bad integrity;
  // UNAVAILABLE when a peer cannot be reached.
  virtual absl::StatusOr<std::shared_ptr<Communicator>> MakeMultiNode(
      const std::string& job, const std::string& comm_id, const v1::JoinCommResponse& layout,
      int my_node, std::shared_ptr<const scheduler::tags::Slot> slot,
      const std::string& asked_integrity) = 0;
};

class DaemonCommFactory : public CommFactory {
 public:
  // Everything here must outlive the communicators made (the daemon's members).
  struct Deps {
    scheduler::Executor* executor = nullptr;
    DeadlineTimer* timer = nullptr;
    metrics::DaemonMetrics* metrics = nullptr;  // null: nothing counted (tests)
    PeerCalls* peers = nullptr;                 // null: peers are not told of failures (tests)
  };
  DaemonCommFactory(const DaemonConfig& config, Deps deps, transport::LinkStack link_stack);

  // Multi-node set-up, before any communicator is made: the transport, and by rail its name and
  // fair queue (null: an unpaced rail).
  void SetFabric(transport::Transport* transport, std::vector<std::string> rail_names,
                 std::vector<std::shared_ptr<transport::FairQueue>> rail_queues);

  std::shared_ptr<Communicator> MakeLocal(const std::string& job, const std::string& comm_id,
                                          int nranks, const v1::CostModel& model) override;
  absl::StatusOr<std::shared_ptr<Communicator>> MakeMultiNode(
      const std::string& job, const std::string& comm_id, const v1::JoinCommResponse& layout,
      int my_node, std::shared_ptr<const scheduler::tags::Slot> slot,
      const std::string& asked_integrity) override;

  // The tuner of a communicator of this layout under the cost model (an invalid model, from an
  // old coordinator, falls back to the defaults). Also what railctl explain weighs.
  std::shared_ptr<scheduler::cost::Tuner> MakeTuner(const scheduler::CommLayout& layout,
                                                    const v1::CostModel& model) const;
  // What every communicator runs with.
  CommEnv Env() const;

 private:
  const DaemonConfig& config_;
  const Deps deps_;
  const transport::LinkStack link_stack_;
  transport::Transport* transport_ = nullptr;
  std::vector<std::string> rail_names_;
  std::vector<std::shared_ptr<transport::FairQueue>> rail_queues_;
};

}  // namespace railyard
