// Steps of a NodeRun waiting for memory that is still being filled (daemon/scheduler/input_gate.h:
// device staging's pipelined copies): FillGate's rule, and a run whose steps read and write
// gated memory, with the values each step saw.
#include "daemon/scheduler/input_gate.h"

#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/scheduler/node_executor.h"

namespace railyard::scheduler {
namespace {

std::function<void(absl::Status)> Record(absl::Status* into, int* calls) {
  return [into, calls](absl::Status st) {
    *into = st;
    ++*calls;
  };
}

TEST(FillGateTest, ARangeIsAdmittedOnceEveryRegionItOverlapsIsFilledThatFar) {
  std::vector<std::byte> a(100), b(50), other(10);
  FillGate gate({{a.data(), a.size()}, {b.data(), b.size()}});
  absl::Status st = absl::UnknownError("not called");
  int calls = 0;
  std::function<void(absl::Status)> wake = Record(&st, &calls);
  EXPECT_TRUE(gate.Admit(other.data(), other.size(), wake));  // not the gate's memory
  EXPECT_TRUE(gate.Admit(a.data(), 0, wake));                 // nothing to touch
  ASSERT_FALSE(gate.Admit(a.data() + 40, 20, wake));          // bytes 40-59 of a
  gate.Advance(0, 59);
  EXPECT_EQ(calls, 0);
  gate.Advance(1, 50);  // another region: still waiting
  EXPECT_EQ(calls, 0);
  gate.Advance(0, 60);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(st.ok()) << st;
  gate.Advance(0, 10);  // never backwards
  wake = Record(&st, &calls);
  EXPECT_TRUE(gate.Admit(a.data(), 60, wake));
  EXPECT_FALSE(gate.Admit(a.data() + 59, 2, wake));
  // WhenFilled: once every region is whole.
  absl::Status filled = absl::UnknownError("not called");
  int filled_calls = 0;
  gate.WhenFilled(Record(&filled, &filled_calls));
  EXPECT_EQ(filled_calls, 0);
  gate.Advance(0, 1000);  // clamped to the region
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(filled_calls, 1);
  EXPECT_TRUE(filled.ok());
  gate.WhenFilled(Record(&filled, &filled_calls));  // already: at once
  EXPECT_EQ(filled_calls, 2);
}

TEST(FillGateTest, AFailureWakesEveryWaiterWithItsErrorAndLaterOnesAtOnce) {
  std::vector<std::byte> a(64);
  FillGate gate({{a.data(), a.size()}});
  absl::Status s1, s2, s3;
  int c1 = 0, c2 = 0, c3 = 0;
  std::function<void(absl::Status)> w1 = Record(&s1, &c1), w2 = Record(&s2, &c2);
  ASSERT_FALSE(gate.Admit(a.data(), 8, w1));
  gate.WhenFilled(Record(&s3, &c3));
  gate.Advance(0, 16);
  EXPECT_EQ(c1, 1);
  ASSERT_FALSE(gate.Admit(a.data() + 32, 8, w2));
  gate.Fail(absl::InternalError("the device copy failed"));
  gate.Fail(absl::DataLossError("a second failure changes nothing"));
  EXPECT_EQ(c2, 1);
  EXPECT_EQ(s2.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(c3, 1);
  EXPECT_EQ(s3.message(), "the device copy failed");
  absl::Status late;
  int late_calls = 0;
  std::function<void(absl::Status)> w = Record(&late, &late_calls);
  EXPECT_FALSE(gate.Admit(a.data() + 40, 1, w));
  EXPECT_EQ(late_calls, 1);
  EXPECT_EQ(late.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(gate.Admit(a.data(), 16, w));  // filled before the failure
}

// A NodeRun of `schedule` over rank 0's send and recv memory on one node, its steps gated by
// one FillGate over [gated, gated + gated_bytes); Start()s it and records how it ends.
struct GatedRun {
  GatedRun(NodeSchedule s, std::byte* send, std::byte* recv, const std::byte* gated,
           uint64_t gated_bytes, std::vector<std::shared_ptr<OutputWatcher>> watchers = {})
      : schedule(std::move(s)),
        gate(std::make_shared<FillGate>(std::vector<FillGate::Region>{{gated, gated_bytes}})),
        gates{gate},
        outputs(std::move(watchers)) {
    memory.send = {send};
    memory.recv = {recv};
    memory.scratch = {nullptr};
    NodeRun::Params p;
    p.schedule = &schedule;
    p.memory = &memory;
    p.endpoints = &endpoints;
    p.node_slots = &slots;
    p.pool = &pool;
    p.gates = &gates;
    p.outputs = &outputs;
    run.Start(p, [this](absl::Status st) {
      result = st;
      done.Notify();
    });
  }
  NodeSchedule schedule;
  std::shared_ptr<FillGate> gate;
  std::vector<std::shared_ptr<InputGate>> gates;
  std::vector<std::shared_ptr<OutputWatcher>> outputs;
  RankMemory memory;
  EndpointTable endpoints;
  std::vector<uint16_t> slots = {0};
  Executor pool{1};
  absl::Notification done;
  absl::Status result = absl::UnknownError("not done");
  NodeRun run;  // last: destroyed first, once done
};

// Fail with OK (a caller's slip) still wakes waiters with an error: an OK would let them touch
// bytes that were never filled.
TEST(FillGateTest, AFailureWithoutAnErrorStillWakesWithOne) {
  std::vector<std::byte> a(16);
  FillGate gate({{a.data(), a.size()}});
  absl::Status st;
  int calls = 0;
  std::function<void(absl::Status)> w = Record(&st, &calls);
  ASSERT_FALSE(gate.Admit(a.data(), 8, w));
  gate.Fail(absl::OkStatus());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
}

// A one-node schedule: rank 0 copies its send region to its recv region in two halves, then
// reduces the first half onto the second in recv. The send region is filled while the run goes.
TEST(NodeRunGateTest, StepsRunOnlyOnFilledBytesAndSeeWhatWasFilled) {
  constexpr uint64_t kHalf = 4096;
  std::vector<float> send(2 * kHalf / 4, -1.0f), recv(2 * kHalf / 4, 0.0f);
  NodeSchedule schedule;
  schedule.node = 0;
  auto copy = [&](uint64_t offset) {
    NodeStep s;
    s.kind = NodeStep::Kind::kCopy;
    s.src = {0, RankRef::Space::kSend, offset};
    s.dst = {0, RankRef::Space::kRecv, offset};
    s.bytes = kHalf;
    return s;
  };
  schedule.steps.push_back(copy(0));
  schedule.steps.push_back(copy(kHalf));
  NodeStep reduce;
  reduce.kind = NodeStep::Kind::kReduce;
  reduce.src = {0, RankRef::Space::kRecv, 0};
  reduce.dst = {0, RankRef::Space::kRecv, kHalf};
  reduce.bytes = kHalf;
  reduce.deps = {0, 1};
  schedule.steps.push_back(reduce);
  GatedRun r(std::move(schedule), reinterpret_cast<std::byte*>(send.data()),
             reinterpret_cast<std::byte*>(recv.data()),
             reinterpret_cast<const std::byte*>(send.data()), 2 * kHalf);
  EXPECT_FALSE(r.done.HasBeenNotified());
  EXPECT_EQ(recv[0], 0.0f);  // the first copy waits: nothing is filled
  // The filler writes the first half, then says so: the first copy runs on this thread.
  for (uint64_t i = 0; i < kHalf / 4; ++i) send[i] = 1.0f + static_cast<float>(i);
  r.gate->Advance(0, kHalf);
  EXPECT_EQ(recv[0], 1.0f);
  EXPECT_EQ(recv[kHalf / 4], 0.0f);  // the second half's copy still waits
  EXPECT_FALSE(r.done.HasBeenNotified());
  for (uint64_t i = kHalf / 4; i < 2 * kHalf / 4; ++i) send[i] = 100.0f;
  r.gate->Advance(0, 2 * kHalf);
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(r.result.ok()) << r.result;
  for (uint64_t i = 0; i < kHalf / 4; ++i) {
    ASSERT_EQ(recv[i], 1.0f + static_cast<float>(i)) << i;
    ASSERT_EQ(recv[kHalf / 4 + i], 101.0f + static_cast<float>(i)) << i;
  }
}

// A combine (dst <- src2 (op) src) reads two sources: it waits for its left operand's bytes too,
// here the only gated ones (its other source and its destination are in recv).
TEST(NodeRunGateTest, ACombineWaitsForItsLeftOperand) {
  constexpr uint64_t kHalf = 4096;
  std::vector<float> send(2 * kHalf / 4, -1.0f), recv(2 * kHalf / 4, 0.0f);
  for (uint64_t i = 0; i < kHalf / 4; ++i) recv[i] = 0.5f;  // the partial received earlier
  NodeSchedule schedule;
  schedule.node = 0;
  NodeStep combine;
  combine.kind = NodeStep::Kind::kCombine;
  combine.src2 = {0, RankRef::Space::kSend, kHalf};
  combine.src = {0, RankRef::Space::kRecv, 0};
  combine.dst = {0, RankRef::Space::kRecv, kHalf};
  combine.bytes = kHalf;
  schedule.steps.push_back(combine);
  GatedRun r(std::move(schedule), reinterpret_cast<std::byte*>(send.data()),
             reinterpret_cast<std::byte*>(recv.data()),
             reinterpret_cast<const std::byte*>(send.data()), 2 * kHalf);
  r.gate->Advance(0, kHalf);  // only the first half of send: not what the combine reads
  EXPECT_FALSE(r.done.HasBeenNotified());
  EXPECT_EQ(recv[kHalf / 4], 0.0f);
  for (uint64_t i = kHalf / 4; i < 2 * kHalf / 4; ++i) send[i] = 2.0f + static_cast<float>(i);
  r.gate->Advance(0, 2 * kHalf);
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(r.result.ok()) << r.result;
  for (uint64_t i = 0; i < kHalf / 4; ++i) {
    ASSERT_EQ(recv[kHalf / 4 + i], 2.5f + static_cast<float>(kHalf / 4 + i)) << i;
  }
}

TEST(NodeRunGateTest, AStepWaitingForBytesThatAreNeverFilledFailsTheRunSayingWhy) {
  std::vector<std::byte> send(64), recv(64);
  NodeSchedule schedule;
  NodeStep s;
  s.kind = NodeStep::Kind::kCopy;
  s.src = {0, RankRef::Space::kSend, 0};
  s.dst = {0, RankRef::Space::kRecv, 0};
  s.bytes = 64;
  schedule.steps.push_back(s);
  GatedRun r(std::move(schedule), send.data(), recv.data(), send.data(), 64);
  r.gate->Advance(0, 32);
  EXPECT_FALSE(r.done.HasBeenNotified());
  r.gate->Fail(absl::InternalError("copying device 0 memory to host memory: gone"));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(r.result.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(r.result.message(),
            "step 0 waited for staged memory that was not filled: copying device 0 memory to "
            "host memory: gone");
}

NodeStep Write(NodeStep::Kind kind, int rank, uint64_t offset, uint64_t bytes) {
  NodeStep s;
  s.kind = kind;
  s.src = {rank, RankRef::Space::kSend, 0};
  s.dst = {rank, RankRef::Space::kRecv, offset};
  s.bytes = bytes;
  return s;
}

// A write is final unless later steps write every byte of it again; only recv regions count.
TEST(FinalRecvWritesTest, AStepIsFinalUnlessLaterWritesCoverAllOfIt) {
  NodeSchedule s;
  using K = NodeStep::Kind;
  s.steps.push_back(Write(K::kCopy, 0, 0, 100));    // 0: covered by 2 and 3 together: not final
  s.steps.push_back(Write(K::kReduce, 0, 0, 150));  // 1: 100-150 covered by 3 only up to 120
  s.steps.push_back(Write(K::kRecv, 0, 0, 60));     // 2: final
  s.steps.push_back(Write(K::kReduce, 0, 60, 60));  // 3: final (60-120)
  s.steps.push_back(Write(K::kCopy, 1, 0, 100));    // 4: another rank's: final
  NodeStep send = Write(K::kSend, 0, 0, 500);       // 5: writes nothing
  s.steps.push_back(send);
  NodeStep scratch = Write(K::kCopy, 0, 0, 500);  // 6: scratch, not recv
  scratch.dst.space = RankRef::Space::kScratch;
  s.steps.push_back(scratch);
  NodeStep narrow = Write(K::kNarrow, 1, 200, 400);  // 7: writes 400 / 4 * 2 bytes of float16
  s.steps.push_back(narrow);
  s.steps.push_back(Write(K::kCopy, 1, 200, 200));  // 8: covers all of 7
  const std::vector<bool> f = FinalRecvWrites(s, kernels::DataType::kFloat16, {});
  EXPECT_EQ(f, (std::vector<bool>{false, true, true, true, true, false, false, false, true}));
  EXPECT_EQ(DstBytes(narrow, kernels::DataType::kFloat16, {}), 200u);
  EXPECT_EQ(DstBytes(send, kernels::DataType::kFloat16, {}), 0u);
}

class RecordingWatcher : public OutputWatcher {
 public:
  void Watched() override {}
  void Written(const std::byte* p, uint64_t n) override {
    absl::MutexLock lock(&mu);
    writes.emplace_back(p, n);
  }
  absl::Mutex mu;
  std::vector<std::pair<const std::byte*, uint64_t>> writes;
};

// A run tells its watchers each final write, with its bytes, before its dependents run.
TEST(NodeRunGateTest, WatchersHearOfFinalWritesOnlyBeforeTheirDependentsRun) {
  std::vector<std::byte> send(256), recv(256);
  NodeSchedule schedule;
  using K = NodeStep::Kind;
  schedule.steps.push_back(Write(K::kCopy, 0, 0, 128));  // 0: overwritten by 1
  schedule.steps.push_back(Write(K::kCopy, 0, 0, 128));  // 1: final
  schedule.steps[1].deps = {0};
  schedule.steps.push_back(Write(K::kCopy, 0, 128, 64));  // 2: final
  schedule.steps[2].deps = {1};
  auto watcher = std::make_shared<RecordingWatcher>();
  // The gate is over memory no step touches: nothing waits.
  std::vector<std::byte> elsewhere(8);
  GatedRun r(std::move(schedule), send.data(), recv.data(), elsewhere.data(), elsewhere.size(),
             {watcher});
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(r.result.ok()) << r.result;
  absl::MutexLock lock(&watcher->mu);
  using Write = std::pair<const std::byte*, uint64_t>;
  ASSERT_EQ(watcher->writes.size(), 2u);
  EXPECT_EQ(watcher->writes[0], Write(recv.data(), 128));
  EXPECT_EQ(watcher->writes[1], Write(recv.data() + 128, 64));
}

}  // namespace
}  // namespace railyard::scheduler
