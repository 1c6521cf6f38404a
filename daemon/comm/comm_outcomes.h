// What a communicator and its parts (point_to_point.h) gather under the communicator's lock and
// act on after releasing it: completions to post, join callbacks, executions to start, transfers
// to fail and sends/receives to issue. Nothing here calls out while the lock is held.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "daemon/comm/pending_request.h"
#include "daemon/scheduler/executor.h"

namespace railyard {

using CommJoinDone = std::function<void(const absl::Status&)>;

struct CommOutcome {
  std::unique_ptr<PendingRequest> request;
  absl::Status status;
  uint64_t seq = 0;
};

struct CommOutcomes {
  std::vector<CommOutcome> completions;
  std::vector<CommJoinDone> joins;
  absl::Status join_status;
  scheduler::Execution* collective = nullptr;          // to start on the executor
  bool start_node_run = false;                         // start the multi-node collective's run
  std::vector<scheduler::Execution*> copies;           // same-daemon send/recv copies to start
  absl::Status abort_transfers;                        // non-OK: fail transfers to other daemons,
  bool abort_transfers_now = false;                    // now, or after a grace period
  bool notify_peers = false;                           // and tell those daemons why,
  std::optional<uint64_t> unrun_seq;                   // and which collective this node won't run
  std::vector<int> departed;                           // local ranks that left cleanly: tell
  absl::Status departed_why;                           // the other daemons (not a failure)
  std::vector<std::function<void()>> transport_posts;  // Send/Recv to issue, outside the lock
};

}  // namespace railyard
