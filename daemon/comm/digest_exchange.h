// The operation digests beside a running multi-node collective (op_digest.h), and the join of
// that run with them. When the run starts, this node sends its digest to every peer node on
// rail 0 and receives theirs; a digest that differs from this node's (or cannot be read) fails
// the run at once on every node with INVALID_ARGUMENT naming both sides, instead of leaving the
// schedules to wait for messages the other side never sends. A schedule's first small message to
// and from each peer rides in the digest (OpDigest::kMaxCarriedBytes): the exchange reports those
// steps to the run (NodeRun::Carried). The collective completes once its run and every digest
// send and receive have, with a disagreement before the run's own status, on the thread that
// finished the last part.
//
// Used by one run at a time (its communicator runs one collective at a time): Prepare, then
// Arm, then the run's Start (whose completion is RunDone), then Exchange.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/comm/op_digest.h"
#include "daemon/scheduler/node_executor.h"
#include "daemon/scheduler/schedule.h"

namespace railyard {

class DigestExchange {
 public:
  struct Env {
    std::string comm_id;
    std::string job;
    const scheduler::CommLayout* layout = nullptr;
    int my_node = 0;
    const scheduler::EndpointTable* endpoints = nullptr;  // [node][rail]
    const std::vector<uint16_t>* node_slots = nullptr;    // tag slots by node
    const std::vector<std::string>* node_names = nullptr;
    scheduler::NodeRun* run = nullptr;  // the run the carried steps belong to
    // Fails the communicator's transfers (a disagreement: the schedules may wait for messages
    // that never come).
    std::function<void(const absl::Status&)> abort_transfers;
    // The collective's outcome, once every part is done.
    std::function<void(const absl::Status&)> done;
  };

  explicit DigestExchange(Env env);

  // Before a run of `schedule`: this node's digest of it, and whether its inputs are still
  // being staged (gated: this node's sends then ride in no digest, their bytes may not be on
  // the host yet).
  void Prepare(const OpDigest& mine, std::shared_ptr<const scheduler::NodeSchedule> schedule,
               bool gated);
  // NodeRun::Params::carried for the prepared run; null with no peer node.
  const std::vector<uint32_t>* carried() const;
  // Expects the run's completion and two parts per peer node.
  void Arm();
  // The run's completion (NodeRun::Start's callback).
  void RunDone(const absl::Status& status) { PartDone(status); }
  // Sends this node's digest to each peer and receives theirs; memory: the run's.
  void Exchange(const scheduler::RankMemory& memory);

 private:
  int peers() const { return env_.layout->nnodes - 1; }
  std::string NodeName(int node) const;
  void PickCarriedSteps();
  void OnPeerDigest(int node, const absl::Status& status, size_t length);
  void PartDone(const absl::Status& status);

  const Env env_;
  OpDigest mine_;
  OpDigest::Wire out_{};
  std::vector<OpDigest::Received> in_;  // by node
  std::shared_ptr<const scheduler::NodeSchedule> schedule_;
  bool gated_ = false;
  // By node: the step of the schedule whose message the digest to (send) or from (recv) that
  // node carries, -1 for none; all of them (for NodeRun::Params::carried); without the sends
  // (a gated run's); and the schedule they were found for (the planner caches schedules by
  // shape, so they are found once per shape; holding it keeps its address from reuse).
  std::vector<int64_t> carried_send_;
  std::vector<int64_t> carried_recv_;
  std::vector<uint32_t> carried_;
  std::vector<uint32_t> carried_gated_;
  std::shared_ptr<const scheduler::NodeSchedule> carried_for_;
  std::atomic<int> parts_{0};
  absl::Mutex mu_;
  absl::Status run_status_ ABSL_GUARDED_BY(mu_);
  absl::Status verdict_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard
