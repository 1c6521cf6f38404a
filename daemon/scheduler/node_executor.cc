#include "daemon/scheduler/node_executor.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/kernels/reduce.h"
#include "daemon/scheduler/compressed.h"

namespace railyard::scheduler {

uint64_t MaxStepTag(const NodeSchedule& schedule) {
  uint64_t max = 0;
  for (const NodeStep& s : schedule.steps) {
    if (s.kind == NodeStep::Kind::kSend || s.kind == NodeStep::Kind::kRecv) {
      max = std::max(max, s.tag);
    }
  }
  return max;
}

std::byte* NodeRun::Resolve(const RankRef& ref) const {
  return scheduler::Resolve(*p_.memory, ref);
}

std::byte* Resolve(const RankMemory& m, const RankRef& ref) {
  std::byte* base = nullptr;
  switch (ref.space) {
    case RankRef::Space::kSend:
      base = m.send[ref.rank];
      break;
    case RankRef::Space::kRecv:
      base = m.recv[ref.rank];
      break;
    case RankRef::Space::kScratch:
      base = m.scratch[ref.rank];
      break;
  }
  return base == nullptr ? nullptr : base + ref.offset;
}

uint64_t DstBytes(const NodeStep& s, kernels::DataType dtype, const kernels::Codec& codec) {
  switch (s.kind) {
    case NodeStep::Kind::kSend:
      return 0;
    case NodeStep::Kind::kNarrow:
      return s.bytes / sizeof(float) * kernels::ElementSize(dtype);
    case NodeStep::Kind::kEncode:
      return kernels::EncodedBytes(codec, s.bytes / sizeof(float));
    default:
      return s.bytes;
  }
}

std::vector<bool> FinalRecvWrites(const NodeSchedule& schedule, kernels::DataType dtype,
                                  const kernels::Codec& codec) {
  const auto& steps = schedule.steps;
  std::vector<bool> final_write(steps.size(), false);
  // By rank, the recv bytes a later step writes: disjoint [begin, end) keyed by begin.
  std::map<int, std::map<uint64_t, uint64_t>> covered;
  for (size_t k = steps.size(); k-- > 0;) {
    const NodeStep& s = steps[k];
    const uint64_t n = DstBytes(s, dtype, codec);
    if (n == 0 || s.dst.space != RankRef::Space::kRecv) continue;
    const uint64_t begin = s.dst.offset;
    const uint64_t end = begin + n;
    std::map<uint64_t, uint64_t>& c = covered[s.dst.rank];
    final_write[k] = !Covers(c, begin, end);  // unless later writes cover all of it
    AddRun(c, begin, end);
  }
  return final_write;
}

void NodeRun::Start(const Params& params, std::function<void(absl::Status)> done) {
  const auto n = static_cast<uint32_t>(params.schedule->steps.size());
  {
    // No step of an earlier run is active: only Progress() can look meanwhile.
    absl::MutexLock lock(&progress_mu_);
    p_ = params;
    progress_schedule_ = params.schedule_owner;
    if (n > progress_capacity_) {  // reused while schedules fit: no allocation per operation
      issued_ns_ = std::make_unique<std::atomic<int64_t>[]>(n);
      finished_ = std::make_unique<std::atomic<int64_t>[]>(n);
      progress_capacity_ = n;
    }
    for (uint32_t i = 0; i < n; ++i) {
      issued_ns_[i].store(0, std::memory_order_relaxed);
      finished_[i].store(0, std::memory_order_relaxed);
    }
    progress_steps_ = n;
    issued_ = issued_ns_.get();
    done_flags_ = finished_.get();
  }
  done_ = std::move(done);
  const auto& steps = p_.schedule->steps;
  {
    absl::MutexLock lock(&mu_);
    error_ = absl::OkStatus();
    failed_ = false;
    done_called_ = n == 0;
  }
  if (n == 0) {
    done_(absl::OkStatus());
    return;
  }
  carried_count_ = p_.carried == nullptr ? 0 : p_.carried->size();
  if (carried_count_ > carried_capacity_) {
    carried_ = std::make_unique<CarriedStep[]>(carried_count_);
    carried_capacity_ = carried_count_;
  }
  // By step, its index in carried_ (-1: not carried); only built when there are any.
  if (carried_count_ > 0) carried_at_.assign(n, -1);
  for (size_t c = 0; c < carried_count_; ++c) {
    CarriedStep& cs = carried_[c];
    cs.step = (*p_.carried)[c];
    if (cs.step < n) carried_at_[cs.step] = static_cast<int32_t>(c);
    cs.state.store(0, std::memory_order_relaxed);
    cs.status = absl::OkStatus();
    cs.payload = nullptr;
    cs.size = 0;
  }
  successors_.resize(n);
  for (auto& s : successors_) s.clear();
  if (p_.outputs != nullptr && !p_.outputs->empty()) {
    final_writes_ = FinalRecvWrites(*p_.schedule, p_.dtype, p_.codec);
  } else {
    final_writes_.clear();
  }
  pending_deps_ = std::make_unique<std::atomic<uint32_t>[]>(n);
  std::vector<uint32_t> initial;
  for (uint32_t i = 0; i < n; ++i) {
    pending_deps_[i].store(static_cast<uint32_t>(steps[i].deps.size()));
    for (uint32_t d : steps[i].deps) successors_[d].push_back(i);
    if (steps[i].deps.empty()) initial.push_back(i);
  }
  remaining_.store(n);
  in_flight_.store(0);
  // Count every initial step as in flight before starting any, so that no early completion can
  // see zero steps in flight and finish the run while others are still to start.
  {
    absl::MutexLock lock(&mu_);
    in_flight_.fetch_add(static_cast<uint32_t>(initial.size()));
  }
  for (uint32_t i : initial) Ready(i);
}

bool NodeRun::Admitted(uint32_t i) {
  const NodeStep& s = p_.schedule->steps[i];
  // The byte counts of codec and widening steps count the float32 side, the larger one: a
  // conservative range, which may wait for a few more bytes but never touches unfilled ones.
  const std::byte* reads = s.kind == NodeStep::Kind::kRecv ? nullptr : Resolve(s.src);
  const std::byte* reads2 = s.kind == NodeStep::Kind::kCombine ? Resolve(s.src2) : nullptr;
  const std::byte* writes = s.kind == NodeStep::Kind::kSend ? nullptr : Resolve(s.dst);
  for (const std::shared_ptr<InputGate>& gate : *p_.gates) {
    for (const std::byte* p : {reads, reads2, writes}) {
      if (p == nullptr) continue;
      std::function<void(absl::Status)> wake = [this, i](absl::Status st) {
        if (st.ok()) {
          Ready(i);
        } else {
          Finished(i, absl::Status(st.code(), absl::StrCat("step ", i,
                                                           " waited for staged memory "
                                                           "that was not filled: ",
                                                           st.message())));
        }
      };
      if (!gate->Admit(p, s.bytes, wake)) return false;
    }
  }
  return true;
}

// Starts step i; in_flight_ already counts it.
void NodeRun::Ready(uint32_t i) {
  if (p_.gates != nullptr && !p_.gates->empty() && !Admitted(i)) return;
  const NodeStep& s = p_.schedule->steps[i];
  switch (s.kind) {
    case NodeStep::Kind::kCopy:
    case NodeStep::Kind::kReduce:
    case NodeStep::Kind::kCombine:
    case NodeStep::Kind::kEncode:
    case NodeStep::Kind::kDecode:
    case NodeStep::Kind::kDecodeAdd:
    case NodeStep::Kind::kWiden:
    case NodeStep::Kind::kWidenAdd:
    case NodeStep::Kind::kNarrow:
      if (s.bytes <= p_.inline_local_max_bytes) {
        RunInline(i);
        return;
      }
      p_.pool->Post([this, i] { Finished(i, RunLocal(i)); });
      return;
    case NodeStep::Kind::kSend:
    case NodeStep::Kind::kRecv:
      if (CarriedStep* c = FindCarried(i)) {
        issued_[i].store(std::chrono::steady_clock::now().time_since_epoch().count(),
                         std::memory_order_relaxed);
        if (c->state.fetch_or(kReady, std::memory_order_acq_rel) & kArrived) FinishCarried(*c);
        return;
      }
      Post(i);
      return;
  }
}

NodeRun::CarriedStep* NodeRun::FindCarried(uint32_t step) {
  if (carried_count_ == 0 || step >= carried_at_.size() || carried_at_[step] < 0) return nullptr;
  return &carried_[carried_at_[step]];
}

bool NodeRun::Failing() {
  absl::MutexLock lock(&mu_);
  return failed_;
}

void NodeRun::Carried(uint32_t step, absl::Status status, const std::byte* payload, size_t size) {
  CarriedStep* c = FindCarried(step);
  if (c == nullptr) return;
  c->status = std::move(status);
  c->payload = payload;
  c->size = size;
  if (c->state.fetch_or(kArrived, std::memory_order_acq_rel) & kReady) FinishCarried(*c);
}

void NodeRun::FinishCarried(CarriedStep& c) {
  const uint32_t i = c.step;
  const NodeStep& s = p_.schedule->steps[i];
  if (!c.status.ok() || s.kind == NodeStep::Kind::kSend) {
    Finished(i, c.status);
    return;
  }
  if (c.size == 0) {  // the peer sent it on its own: receive it as usual, unless failing
    if (Failing()) {
      // A receive posted now would hold the run (and its done) until the deadline's abort.
      Finished(i, absl::CancelledError("the run failed before this receive was posted"));
      return;
    }
    Post(i);
    return;
  }
  if (c.size != s.bytes) {
    Finished(i, absl::InvalidArgumentError(absl::StrCat("node ", s.peer, " sent ", c.size,
                                                        " bytes with its operation digest for a ",
                                                        s.bytes, "-byte receive")));
    return;
  }
  kernels::Copy(Resolve(s.dst), c.payload, c.size);
  Finished(i, absl::OkStatus());
}

// Posts transfer step i (a send or a receive) to its endpoint; in_flight_ already counts it.
void NodeRun::Post(uint32_t i) {
  const NodeStep& s = p_.schedule->steps[i];
  const EndpointTable& eps = *p_.endpoints;
  transport::Endpoint* ep = nullptr;
  if (s.peer >= 0 && static_cast<size_t>(s.peer) < eps.size() && s.rail >= 0 &&
      static_cast<size_t>(s.rail) < eps[s.peer].size()) {
    ep = eps[s.peer][s.rail].get();
  }
  const std::vector<uint16_t>& slots = *p_.node_slots;
  const int me = p_.schedule->node;
  if (ep == nullptr || static_cast<size_t>(s.peer) >= slots.size() ||
      static_cast<size_t>(me) >= slots.size()) {
    Finished(i,
             absl::InternalError(absl::StrCat("no endpoint to node ", s.peer, " rail ", s.rail)));
    return;
  }
  issued_[i].store(std::chrono::steady_clock::now().time_since_epoch().count(),
                   std::memory_order_relaxed);
  if (s.kind == NodeStep::Kind::kSend) {
    const transport::Tag tag = tags::CollectiveTag(slots[s.peer], me, p_.seq, s.tag);
    ep->Send(tag, Resolve(s.src), s.bytes, [this, i](absl::Status st) { Finished(i, st); });
  } else {
    const transport::Tag tag = tags::CollectiveTag(slots[me], s.peer, p_.seq, s.tag);
    ep->Recv(tag, Resolve(s.dst), s.bytes, [this, i](absl::Status st) { Finished(i, st); });
  }
}

namespace {
// The local steps waiting to run inline on this thread (see NodeRun::RunInline); null when this
// thread is not running any.
thread_local std::vector<std::pair<NodeRun*, uint32_t>>* inline_queue = nullptr;
}  // namespace

RunProgress NodeRun::Progress() const {
  RunProgress out;
  absl::MutexLock lock(&progress_mu_);
  if (progress_steps_ == 0 || progress_schedule_ == nullptr) return out;
  const auto& steps = progress_schedule_->steps;
  out.steps_total = progress_steps_;
  for (uint32_t i = 0; i < progress_steps_ && i < steps.size(); ++i) {
    if (const int64_t finished = finished_[i].load(std::memory_order_relaxed); finished != 0) {
      ++out.steps_done;
      if (finished > 1) {
        const NodeStep& s = steps[i];
        const auto at =
            std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(finished));
        auto seen = std::find_if(
            out.received.begin(), out.received.end(),
            [&](const RunProgress::Received& r) { return r.peer == s.peer && r.rail == s.rail; });
        if (seen == out.received.end()) {
          out.received.push_back({s.peer, s.rail, at});
        } else if (at > seen->last) {
          seen->last = at;
        }
      }
      continue;
    }
    const int64_t issued = issued_ns_[i].load(std::memory_order_relaxed);
    if (issued == 0) continue;
    const NodeStep& s = steps[i];
    RunProgress::Transfer t;
    t.step = i;
    t.send = s.kind == NodeStep::Kind::kSend;
    t.peer = s.peer;
    t.rail = s.rail;
    t.bytes = s.bytes;
    t.issued = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(issued));
    out.transfers.push_back(t);
  }
  return out;
}

void NodeRun::RunInline(uint32_t i) {
  if (inline_queue != nullptr) {
    // Already inside a step's Finished on this thread: run it once that returns. The step counts
    // as in flight, so the run (and this object) stays alive until it has finished.
    inline_queue->emplace_back(this, i);
    return;
  }
  std::vector<std::pair<NodeRun*, uint32_t>> queue;
  inline_queue = &queue;
  Finished(i, RunLocal(i));
  while (!queue.empty()) {
    const auto [run, step] = queue.back();
    queue.pop_back();
    run->Finished(step, run->RunLocal(step));
  }
  inline_queue = nullptr;
}

absl::Status NodeRun::RunLocal(uint32_t i) {
  const NodeStep& s = p_.schedule->steps[i];
  std::byte* dst = Resolve(s.dst);
  const std::byte* src = Resolve(s.src);
  const size_t esize = kernels::ElementSize(p_.dtype);
  const uint64_t count = s.bytes / esize;
  const bool divide = s.finalize && p_.red_op == kernels::RedOp::kAvg;
  switch (s.kind) {
    case NodeStep::Kind::kCopy:
      if (divide) {
        const void* srcs[1] = {src};
        kernels::Reduce(p_.dtype, kernels::RedOp::kAvg, dst, srcs, 1, count, p_.nranks);
      } else {
        kernels::Copy(dst, src, s.bytes);
      }
      return absl::OkStatus();
    case NodeStep::Kind::kEncode:
    case NodeStep::Kind::kDecode:
    case NodeStep::Kind::kDecodeAdd: {
      // Codec steps work on the float32 partial: bytes / 4 elements.
      float* residual = s.kind == NodeStep::Kind::kEncode && p_.residual != nullptr
                            ? p_.residual + s.aux
                            : nullptr;
      absl::Status st = RunCodecStep(s.kind, p_.codec, src, dst, s.bytes / sizeof(float), residual);
      if (!st.ok()) {
        const NodeStep& from = p_.schedule->steps[s.deps.empty() ? i : s.deps[0]];
        return absl::InvalidArgumentError(absl::StrCat("compressed data from node ", from.peer,
                                                       " on rail ", from.rail,
                                                       " is malformed: ", st.message()));
      }
      return absl::OkStatus();
    }
    case NodeStep::Kind::kWiden:
    case NodeStep::Kind::kWidenAdd:
    case NodeStep::Kind::kNarrow:
      RunConvertStep(s.kind, p_.dtype, src, dst, s.bytes / sizeof(float), divide ? p_.nranks : 1);
      return absl::OkStatus();
    case NodeStep::Kind::kReduce:
    case NodeStep::Kind::kCombine:
      break;
    case NodeStep::Kind::kSend:
    case NodeStep::Kind::kRecv:
      return absl::InternalError("a transfer step ran as a local step");
  }
  // dst <- dst (op) src, or src2 (op) src; avg accumulates sums until the finalizing step divides.
  kernels::RedOp op = p_.red_op;
  if (op == kernels::RedOp::kAvg && !divide) op = kernels::RedOp::kSum;
  const void* srcs[2] = {s.kind == NodeStep::Kind::kCombine ? Resolve(s.src2) : dst, src};
  kernels::Reduce(p_.dtype, op, dst, srcs, 2, count, p_.nranks);
  return absl::OkStatus();
}

void NodeRun::Finished(uint32_t i, const absl::Status& status) {
  int64_t finished = 1;
  if (status.ok() && p_.schedule->steps[i].kind == NodeStep::Kind::kRecv) {
    finished = std::chrono::steady_clock::now().time_since_epoch().count();
  }
  done_flags_[i].store(finished, std::memory_order_relaxed);
  if (status.ok() && i < final_writes_.size() && final_writes_[i]) {
    // Before any step that depends on it starts: a later write of the same bytes is told later.
    const NodeStep& s = p_.schedule->steps[i];
    const std::byte* dst = Resolve(s.dst);
    const uint64_t n = DstBytes(s, p_.dtype, p_.codec);
    if (dst != nullptr) {
      for (const std::shared_ptr<OutputWatcher>& w : *p_.outputs) w->Written(dst, n);
    }
  }
  if (status.ok() && !Failing()) {
    for (uint32_t succ : successors_[i]) {
      if (pending_deps_[succ].fetch_sub(1) == 1) {
        {
          absl::MutexLock lock(&mu_);
          if (failed_) continue;  // abandoned: the run is failing
          in_flight_.fetch_add(1);
        }
        Ready(succ);
      }
    }
  }
  bool call = false;
  std::function<void(const absl::Status&)> on_failing;
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    in_flight_.fetch_sub(1);
    if (status.ok()) {
      remaining_.fetch_sub(1);
    } else if (!failed_) {
      failed_ = true;
      error_ = status;
      if (in_flight_.load() > 0) on_failing = p_.on_failing;  // copied: done may restart the run
    }
    if (!done_called_ &&
        ((!failed_ && remaining_.load() == 0) || (failed_ && in_flight_.load() == 0))) {
      done_called_ = true;
      call = true;
      result = error_;
    }
  }
  if (on_failing) {
    // What is still in flight is aborted; its completions finish the run, possibly inside this
    // call, after which this run may already be running its next schedule: nothing of it is
    // touched after.
    on_failing(status);
    return;
  }
  // Transport callbacks run on a rail's progress thread, which must not block for long: with
  // complete_inline the completion (bounded work, whatever the size) runs here, else on the pool.
  // Last touch of this run either way.
  if (!call) return;
  static thread_local int completing_inline = 0;
  if (p_.complete_inline && completing_inline == 0) {
    std::function<void(absl::Status)> done = done_;  // done may start this run again
    ++completing_inline;
    done(result);
    --completing_inline;
    return;
  }
  p_.pool->Post([done = done_, result] { done(result); });
}

}  // namespace railyard::scheduler
