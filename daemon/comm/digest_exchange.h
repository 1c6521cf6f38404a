// The operation digests beside a running multi-node collective (op_digest.h), and the join of
// that run with them. Every node must learn, before the collective completes anywhere, whether
// every node submitted the same operation; it learns it by recursive doubling over a summary of
// what a group knows (digest_summary.h), in ceil(log2 N) messages per node, not N-1:
//   - with P the largest power of two <= N, each node n >= P ("extra") first sends its digest to
//     n - P and, at the end, receives the final summary from it;
//   - nodes below P, having merged their extra's digest, exchange summaries with n XOR 2^r in
//     rounds r = 0 .. log2(P)-1, each round's message sent once the previous round's arrived, and
//     merge what they receive (the group of lower number first, so every node ends with the same
//     summary).
// N = 2 is one message each way; 8 nodes send 3 each, 16 send 4. A disagreement (or a summary
// that cannot be read) found anywhere reaches every node in the same rounds and fails the run on
// every node with INVALID_ARGUMENT naming both sides and their ranks, instead of leaving the
// schedules to wait for messages the other side never sends; a node fails its transfers only
// once its own messages of the exchange have gone, so that the others hear. A schedule's first
// small message to and from a peer rides in a digest message that leaves when the run starts (to
// the round-0 partner, or an extra's to its partner) (OpDigest::kMaxCarriedBytes): the exchange
// reports those steps to the run (NodeRun::Carried). The collective completes once its run and
// every digest send and receive have, with a disagreement before the run's own status, on the
// thread that finished the last part.
//
// Used by one run at a time (its communicator runs one collective at a time): Prepare, then
// Arm, then the run's Start (whose completion is RunDone), then Exchange.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/comm/digest_summary.h"
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
  // Expects the run's completion and each message this node sends and receives.
  void Arm();
  // The run's completion (NodeRun::Start's callback).
  void RunDone(const absl::Status& status) { PartDone(status); }
  // Takes this node's part in the exchange; memory: the run's (valid until it is done).
  void Exchange(const scheduler::RankMemory& memory);

  // The shape of the exchange for `nodes` nodes, as node `me` takes part in it: the messages it
  // sends (and receives: as many) per operation.
  static int MessagesPerOperation(int nodes, int me);

 private:
  // One step of this node's part in the exchange, in order: a receive to merge, a send of the
  // summary so far, or both (a round: the send leaves first).
  struct Stage {
    int partner = 0;
    bool send = false;
    bool recv = false;
    // How what arrives merges: kFold (an extra's digest into this node's, this one lower),
    // kLower / kUpper (a round: this node's group is the lower / upper one), kFinal (an extra
    // takes the final summary as it is).
    enum class Merge : uint8_t { kNone, kFold, kLower, kUpper, kFinal } merge = Merge::kNone;
    int round = -1;  // kLower / kUpper: which round (the sender's group)
  };

  // Node me's stages for `nodes` nodes, in order.
  static std::vector<Stage> Plan(int nodes, int me);
  int peers() const { return env_.layout->nnodes - 1; }
  std::string NodeName(int node) const;
  std::vector<int> RanksOf(int node) const;
  void PlanStages();
  // Whether src's exchange message to dst leaves when src's run starts (it may carry).
  bool LeavesAtStart(int src, int dst) const;
  // Whether `node` may be named in a summary that `sender` sends at `stage`.
  bool InSendersGroup(int node, const Stage& stage) const;
  void PickCarriedSteps();
  transport::Endpoint* EndpointTo(int node) const;
  void OnPeerMessage(int node, const absl::Status& status, size_t length);
  // Merges what has arrived, in order, and sends what that allows; the final summary's verdict.
  void Drive();
  void Send(size_t stage);
  void DigestPartDone(const absl::Status& status);
  void PartDone(const absl::Status& status);

  const Env env_;
  int pow2_ = 1;  // the largest power of two <= nodes
  std::vector<Stage> stages_;
  std::vector<int> recv_stage_;  // by node: the stage that receives from it, -1 for none
  int sends_ = 0, recvs_ = 0;
  OpDigest mine_;
  std::vector<DigestSummary::Wire> out_;  // by stage
  std::vector<size_t> out_length_;        // by stage
  // By node: room for a summary and what it may carry.
  using Received = std::array<std::byte, DigestSummary::kMaxBytes + OpDigest::kMaxCarriedBytes>;
  std::vector<Received> in_;
  std::shared_ptr<const scheduler::NodeSchedule> schedule_;
  const scheduler::RankMemory* memory_ = nullptr;  // the run's (Exchange)
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
  size_t stage_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<DigestSummary> received_ ABSL_GUARDED_BY(mu_);  // by stage
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);            // by stage
  DigestSummary summary_ ABSL_GUARDED_BY(mu_);
  int digest_parts_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status run_status_ ABSL_GUARDED_BY(mu_);
  absl::Status verdict_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard
