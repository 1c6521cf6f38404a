// Runs one daemon's NodeSchedule for one operation: local steps on the worker pool, sends and
// receives through the transport, each step as soon as its dependencies are done.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/kernels/types.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/transport/transport.h"

namespace railyard::scheduler {

// Where the ranks' memory is in this daemon, by global rank (entries of other nodes' ranks are
// unused).
struct RankMemory {
  std::vector<std::byte*> send;
  std::vector<std::byte*> recv;
  std::vector<std::byte*> scratch;
};

// Endpoints to the other daemons of a communicator: endpoints[node][rail]; null for this node.
using EndpointTable = std::vector<std::vector<std::shared_ptr<transport::Endpoint>>>;

// Packs a transport tag: 16 bits of communicator hash, 12 bits of sequence number, 12 bits of
// sending node, 24 bits of the schedule's step tag. Unique among what is in flight to one rail
// worker because operations of a communicator run one at a time.
transport::Tag MakeTag(uint64_t comm_hash, uint64_t seq, int sender_node, uint64_t step_tag);

class NodeRun {
 public:
  struct Params {
    const NodeSchedule* schedule = nullptr;
    const RankMemory* memory = nullptr;
    const EndpointTable* endpoints = nullptr;
    kernels::DataType dtype = kernels::DataType::kFloat32;
    kernels::RedOp red_op = kernels::RedOp::kSum;
    uint32_t nranks = 1;  // avg divisor
    uint64_t comm_hash = 0;
    uint64_t seq = 0;
    Executor* pool = nullptr;
  };

  // Starts the run; done is called exactly once, after every step has finished or, on the first
  // error, after every transport operation already issued has completed (so no buffer is still
  // in use by the transport when done runs).
  void Start(const Params& params, std::function<void(absl::Status)> done);

 private:
  void Ready(uint32_t step);
  void RunLocal(uint32_t step);
  void Finished(uint32_t step, const absl::Status& status);
  std::byte* Resolve(const RankRef& ref) const;

  Params p_;
  std::function<void(absl::Status)> done_;
  std::vector<std::vector<uint32_t>> successors_;
  std::unique_ptr<std::atomic<uint32_t>[]> pending_deps_;
  std::atomic<uint32_t> remaining_{0};  // steps not yet finished
  std::atomic<uint32_t> in_flight_{0};  // steps started and not finished
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool done_called_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace railyard::scheduler
