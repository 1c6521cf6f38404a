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
#include "daemon/scheduler/input_gate.h"
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

// Where ref is in memory: null when its rank has no such region here.
std::byte* Resolve(const RankMemory& memory, const RankRef& ref);

// The bytes step s writes at its dst (0: it writes none): s.bytes, except where dst holds
// another width than the float32 side s.bytes counts (kNarrow: the dtype's; kEncode: the wire's).
uint64_t DstBytes(const NodeStep& s, kernels::DataType dtype, const kernels::Codec& codec);

// By step: whether it is the last step (in schedule order, which deps make the order of any two
// writes of the same bytes) to write some byte of a recv region. Empty schedules: empty.
std::vector<bool> FinalRecvWrites(const NodeSchedule& schedule, kernels::DataType dtype,
                                  const kernels::Codec& codec);

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
  // The last receive from `peer` on `rail` that arrived in this run (one entry per pair that
  // delivered any): the evidence that a rail, not its peer, stopped (rail_stall.h).
  struct Received {
    int peer = 0;
    int rail = 0;
    std::chrono::steady_clock::time_point last;
  };
  uint32_t steps_total = 0;
  uint32_t steps_done = 0;
  std::vector<Transfer> transfers;  // issued and not finished, by step
  std::vector<Received> received;
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
    // Transfer steps whose message the caller carries in one of its own (the operation digest,
    // daemon/comm/op_digest.h): the run does not post them; Carried() reports each one's
    // outcome, and the step finishes once it is also ready. A send listed here must have no
    // dependencies (its bytes leave with the caller's message, before the run could order them).
    const std::vector<uint32_t>* carried = nullptr;  // null: none
    // Memory being filled while the run goes (device staging, input_gate.h): a step that reads
    // or writes bytes of it not filled yet waits for them. A carried send must not read such
    // memory (its bytes leave before the run starts). Null or empty: none.
    const std::vector<std::shared_ptr<InputGate>>* gates = nullptr;
    // Told of every final write to a recv region (input_gate.h: OutputWatcher), so that results
    // can leave before the run ends. Null or empty: none.
    const std::vector<std::shared_ptr<OutputWatcher>>* outputs = nullptr;
    // Called once, on the run's first error, on the thread that saw it and outside the run's
    // lock, when transport operations are still in flight: the run calls done only once they
    // have completed, and a receive whose peer stopped sending (it failed too, at a step this
    // node's later sends would have unblocked) completes only when aborted. The owner aborts
    // them (Communicator: its endpoints, after a grace). It may complete the run, and start the
    // next, before it returns. Null: they are waited for.
    std::function<void(const absl::Status&)> on_failing;
  };
  static constexpr size_t kDefaultInlineLocalMaxBytes = 256 * 1024;

  // Starts the run; done is called exactly once, after every step has finished or, on the first
  // error, after every transport operation already issued has completed (so no buffer is still
  // in use by the transport when done runs).
  void Start(const Params& params, std::function<void(absl::Status)> done);

  // The outcome of carried step `step` (Params::carried), once, from any thread, after Start:
  // for a send, whether the caller's message has left; for a receive, its status and the
  // payload that came with it (copied into the step's destination once the step is ready; it
  // must stay valid until the run is done). A receive that arrived OK with no payload (size 0)
  // is posted as usual when ready: the peer sent it on its own. A payload of another size than
  // the step's fails the step (INVALID_ARGUMENT).
  void Carried(uint32_t step, absl::Status status, const std::byte* payload = nullptr,
               size_t size = 0);

  // The current (or last) run's steps: from any thread, at any time. Costs the run nothing but
  // a clock read per transfer it issues.
  RunProgress Progress() const;

 private:
  struct CarriedStep {
    uint32_t step = 0;
    // kReady | kArrived: whoever sets the second one finishes the step.
    std::atomic<uint8_t> state{0};
    absl::Status status;  // written before kArrived is set
    const std::byte* payload = nullptr;
    size_t size = 0;
  };
  static constexpr uint8_t kReady = 1;
  static constexpr uint8_t kArrived = 2;
  CarriedStep* FindCarried(uint32_t step);  // null: step is not carried
  bool Failing();                           // failed_, under mu_
  // Both halves are in: finish a carried step (its receive posted, its payload copied, or its
  // outcome passed on).
  void FinishCarried(CarriedStep& c);
  void Post(uint32_t step);  // posts transfer step `step` to its endpoint
  void Ready(uint32_t step);
  // Whether step's memory is filled (Params::gates); if not, the step waits in a gate, which
  // calls Ready again (or fails the step) when it is.
  bool Admitted(uint32_t step);
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
  std::vector<bool> final_writes_;  // FinalRecvWrites, when Params::outputs has any
  std::unique_ptr<std::atomic<uint32_t>[]> pending_deps_;
  std::atomic<uint32_t> remaining_{0};  // steps not yet finished
  std::atomic<uint32_t> in_flight_{0};  // steps started and not finished
  // Per step, for Progress(): when its transfer was issued (steady clock ns; 0: not issued) and
  // when it finished (steady clock ns for a receive whose bytes arrived, 1 for any other step;
  // 0: not finished). Replaced by Start under progress_mu_, which Progress() holds.
  mutable absl::Mutex progress_mu_;
  std::unique_ptr<std::atomic<int64_t>[]> issued_ns_ ABSL_GUARDED_BY(progress_mu_);
  std::unique_ptr<std::atomic<int64_t>[]> finished_ ABSL_GUARDED_BY(progress_mu_);
  uint32_t progress_steps_ ABSL_GUARDED_BY(progress_mu_) = 0;
  uint32_t progress_capacity_ ABSL_GUARDED_BY(progress_mu_) = 0;
  std::shared_ptr<const NodeSchedule> progress_schedule_ ABSL_GUARDED_BY(progress_mu_);
  // The same arrays, for the steps themselves (valid while the run that Start made them for runs).
  std::atomic<int64_t>* issued_ = nullptr;
  std::atomic<int64_t>* done_flags_ = nullptr;
  // This run's carried steps (Params::carried); few (one send and one receive per peer at most),
  // in an array reused while they fit.
  std::unique_ptr<CarriedStep[]> carried_;
  size_t carried_count_ = 0;
  size_t carried_capacity_ = 0;
  std::vector<int32_t> carried_at_;  // by step: its index in carried_, or -1
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool done_called_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace railyard::scheduler
