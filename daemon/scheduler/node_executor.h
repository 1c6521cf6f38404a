// Runs one daemon's NodeSchedule for one operation: local steps on the worker pool, sends and
// receives through the transport, each step as soon as its dependencies are done.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/kernels/codec.h"
#include "daemon/kernels/types.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/scheduler/tags.h"
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

// The largest per node pair step tag of a schedule (tags.h bounds it by kMaxStepTags), 0 if
// it sends nothing.
uint64_t MaxStepTag(const NodeSchedule& schedule);

// What a run has done and what it waits for (railctl diagnose): a snapshot, taken while it runs.
struct RunProgress {
  struct Transfer {
    uint32_t step = 0;
    bool send = false;
    int peer = 0;
    int rail = 0;
    uint64_t bytes = 0;
    std::chrono::steady_clock::time_point issued;
  };
  uint32_t steps_total = 0;
  uint32_t steps_done = 0;
  std::vector<Transfer> transfers;  // issued and not finished, by step
};

class NodeRun {
 public:
  struct Params {
    const NodeSchedule* schedule = nullptr;
    const RankMemory* memory = nullptr;
    const EndpointTable* endpoints = nullptr;
    kernels::DataType dtype = kernels::DataType::kFloat32;
    kernels::RedOp red_op = kernels::RedOp::kSum;
    uint32_t nranks = 1;  // avg divisor
    // The tag slot each node's daemon gave this communicator (tags.h), by node index: messages
    // to node n are tagged with node_slots[n], receives with this node's.
    const std::vector<uint16_t>* node_slots = nullptr;
    uint64_t seq = 0;
    Executor* pool = nullptr;
    // Local steps (copies, reductions) of at most this many bytes run on the thread whose
    // completion made them ready (often a rail's progress thread) instead of on the pool: a
    // chunk's reduction then costs no hand-off to a worker and back (two thread wake-ups, which
    // cost more than a small reduction). Larger ones go to the pool so that a transport thread
    // never stops progressing its rail for long. 0: every local step on the pool.
    size_t inline_local_max_bytes = kDefaultInlineLocalMaxBytes;
    // done runs on the thread that finished the last step (often a rail's progress thread)
    // unless that thread is already inside such a call: what done does, completing the
    // operation and starting the next, costs the same at any size and less than the hand-off to
    // a worker, which costs a wake-up. false: always on the pool.
    bool complete_inline = false;
    // Compressed schedules (compressed.h): the codec of their kEncode/kDecode steps, and the
    // error-feedback residual (schedule->residual_elems floats) their encodes add in and update;
    // null: encode without feedback.
    kernels::Codec codec;
    float* residual = nullptr;
    // Keeps `schedule` alive for Progress() after the run (optional: without it Progress()
    // reports nothing).
    std::shared_ptr<const NodeSchedule> schedule_owner;
  };
  static constexpr size_t kDefaultInlineLocalMaxBytes = 256 * 1024;

  // Starts the run; done is called exactly once, after every step has finished or, on the first
  // error, after every transport operation already issued has completed (so no buffer is still
  // in use by the transport when done runs).
  void Start(const Params& params, std::function<void(absl::Status)> done);

  // The current (or last) run's steps: from any thread, at any time. Costs the run nothing but
  // a clock read per transfer it issues.
  RunProgress Progress() const;

 private:
  void Ready(uint32_t step);
  // A local step; a decode of malformed peer bytes fails it (INVALID_ARGUMENT).
  absl::Status RunLocal(uint32_t step);
  // RunLocal + Finished on this thread; steps that become ready meanwhile and run inline too are
  // queued (per thread) rather than recursed into.
  void RunInline(uint32_t step);
  void Finished(uint32_t step, const absl::Status& status);
  std::byte* Resolve(const RankRef& ref) const;

  Params p_;
  std::function<void(absl::Status)> done_;
  std::vector<std::vector<uint32_t>> successors_;
  std::unique_ptr<std::atomic<uint32_t>[]> pending_deps_;
  std::atomic<uint32_t> remaining_{0};  // steps not yet finished
  std::atomic<uint32_t> in_flight_{0};  // steps started and not finished
  // Per step, for Progress(): when its transfer was issued (steady clock ns; 0: not issued) and
  // whether it finished. Replaced by Start under progress_mu_, which Progress() holds.
  mutable absl::Mutex progress_mu_;
  std::unique_ptr<std::atomic<int64_t>[]> issued_ns_ ABSL_GUARDED_BY(progress_mu_);
  std::unique_ptr<std::atomic<bool>[]> finished_ ABSL_GUARDED_BY(progress_mu_);
  uint32_t progress_steps_ ABSL_GUARDED_BY(progress_mu_) = 0;
  uint32_t progress_capacity_ ABSL_GUARDED_BY(progress_mu_) = 0;
  std::shared_ptr<const NodeSchedule> progress_schedule_ ABSL_GUARDED_BY(progress_mu_);
  // The same arrays, for the steps themselves (valid while the run that Start made them for runs).
  std::atomic<int64_t>* issued_ = nullptr;
  std::atomic<bool>* done_flags_ = nullptr;
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool done_called_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace railyard::scheduler
