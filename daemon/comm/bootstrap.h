// Communicator bootstrap on the coordinator (the daemon named in the comm id): collects, for each
// rank, the daemon (node) it lives on, then fixes the node order and the rail count and gives every
// rank the same layout. Daemons join once per local rank, by RPC (Peer.JoinComm) or, on the
// coordinator itself, by a direct call.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/util/caller_shares.h"
#include "daemon/util/deadline_timer.h"
#include "railyard/v1/peer.pb.h"

namespace railyard {

class CommBootstrap {
 public:
  using Done = std::function<void(const absl::StatusOr<v1::JoinCommResponse>&)>;

  struct Limits {
    // Bootstraps waiting for ranks at once (--max_pending_joins): more is RESOURCE_EXHAUSTED.
    size_t max_pending = 1024;
    // Comm ids of completed bootstraps remembered with their job, the oldest forgotten first:
    // ~100 bytes each. A comm id is bound to the job that first joined it while it is pending
    // and until this many later bootstraps completed.
    size_t remembered_formed = 4096;
    // Bytes of the NodeInfos all pending bootstraps hold (each join's node, up to 64 rail
    // addresses of 4 KiB): a join past it is RESOURCE_EXHAUSTED. The count and size checks alone
    // would let 1024 bootstraps of 65536 ranks hold terabytes.
    size_t max_pending_bytes = size_t{256} << 20;
    // Of those bytes, what one job's pending bootstraps may hold (0: no share).
    size_t max_pending_bytes_per_job = size_t{64} << 20;
    // Of max_pending, what one job may hold (--max_pending_joins_per_job; 0: no share), so that
    // one job's joins that never complete cannot keep every other job from forming
    // communicators.
    size_t max_pending_per_job = 64;
  };

  explicit CommBootstrap(DeadlineTimer* timer) : CommBootstrap(timer, Limits()) {}
  CommBootstrap(DeadlineTimer* timer, Limits limits) : timer_(timer), limits_(limits) {}

  // Adds a rank (the caller checked the request: CheckJoinRequest, daemon/comm/peer_input.h).
  // done runs (from some thread) once every rank has joined, or with DEADLINE_EXCEEDED naming the
  // missing ranks after `timeout` (counted from the first join). Errors found at once are
  // returned and done is not called: INVALID_ARGUMENT for a bad rank/nranks or nranks
  // disagreement, ALREADY_EXISTS for a rank that joined twice, PERMISSION_DENIED for a comm id
  // another job is bootstrapping or formed (see Limits), RESOURCE_EXHAUSTED past
  // Limits::max_pending or max_pending_bytes. The layout answered carries a fresh random non-zero
  // data_secret and the strongest integrity any rank asked for.
  absl::Status Join(const v1::JoinCommRequest& req, absl::Duration timeout, Done done);
  // Answers every pending bootstrap's joins with `status` (the daemon is stopping) and cancels
  // their deadlines; joins after it are refused with the same status.
  void Shutdown(const absl::Status& status);
  // Bootstraps waiting for ranks, and the bytes of node information they hold; a job's.
  size_t pending() const;
  size_t pending_of(const std::string& job) const;
  size_t pending_bytes() const;

  // The layout for a complete set of joins (exposed for tests): node order by each node's lowest
  // rank, rails = the minimum over nodes.
  static v1::JoinCommResponse Layout(const std::vector<v1::NodeInfo>& node_of_each_rank);
  // INVALID_ARGUMENT when the layout has more nodes than a tag can name, a slot that does not fit
  // a tag, no ranks or more than a tag can name, a rank on a node it does not list, a listed
  // node without a rank or one daemon (NodeId) listed twice; FAILED_PRECONDITION when a node of a
  // multi-node layout announced no tag slot. The coordinator checks the layout it makes; every
  // member checks the one it receives (from another daemon: untrusted) before it indexes anything
  // with it.
  static absl::Status CheckLayoutFits(const v1::JoinCommResponse& layout,
                                      const std::string& comm_id);
  // A daemon's identity in a layout: its peer address, or its name when it has none.
  static std::string NodeId(const v1::NodeInfo& node);

  // The cost model handed to every member of communicators completed from now on (this
  // daemon's calibration), so that all of them tune with the same numbers.
  void SetCostModel(const v1::CostModel& model);

 private:
  // Only what has joined is kept: nranks comes from the first request, so sizing anything by it
  // would let one small JoinComm make the coordinator hold megabytes until the deadline.
  struct Joined {
    v1::NodeInfo node;
    Done done;
  };
  struct Pending {
    std::string job;        // the job of the first join: only it may join
    std::string integrity;  // the strongest asked for so far
    int nranks = 0;
    std::map<int, Joined> joined;  // by rank
    DeadlineTimer::Id timer = 0;
    uint64_t generation = 0;
    std::map<std::string, int64_t> node_slots;  // by NodeId: the tag slot announced (-1: none)
    size_t bytes = 0;                           // of the joined NodeInfos

    // Moves the waiting joins' callbacks to *out (an expired or cancelled bootstrap answers
    // them all with one status, outside the lock).
    void TakeDones(std::vector<Done>* out);
  };
  void OnDeadline(const std::string& comm_id, uint64_t generation);
  // Forgets a pending bootstrap: its bytes and its job's share.
  void ErasePendingLocked(std::map<std::string, Pending>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberFormed(const std::string& comm_id, const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  DeadlineTimer* timer_;
  const Limits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);  // by comm id
  size_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;                // the sum of their bytes
  // Pending bootstraps by job (their count against the shares), and each job's bytes.
  CallerShares<std::string> job_pending_ ABSL_GUARDED_BY(mu_){limits_.max_pending,
                                                              limits_.max_pending_per_job};
  std::map<std::string, size_t> job_bytes_ ABSL_GUARDED_BY(mu_);
  // Completed bootstraps' comm id -> job, and the ids in the order they completed.
  std::map<std::string, std::string> formed_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> formed_order_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status stopped_ ABSL_GUARDED_BY(mu_);  // set by Shutdown
  v1::CostModel cost_model_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard
