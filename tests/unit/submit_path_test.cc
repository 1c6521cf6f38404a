// SubmitPath on its own, in one process: real sessions with memfd buffers, a real one-node
// communicator, recording sinks. What it routes, what it refuses (and that a refused request lets
// its stream go), what it holds for a stream and when it lets go, and its stop.
#include "daemon/submit/submit_path.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/comm/communicator.h"
#include "daemon/scheduler/executor.h"
#include "daemon/session/session.h"
#include "daemon/session/shm_segment.h"
#include "daemon/util/deadline_timer.h"
#include "daemon/util/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fakes.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;
using testing::RecordingSink;

constexpr uint64_t kBuffer = 1;
constexpr uint64_t kHandle = 7;
constexpr uint64_t kBufferBytes = 4096;
// Where the stream words live in each rank's buffer (ready at +0, done at +4).
constexpr uint64_t kWordsOffset = 2048;

std::shared_ptr<MappedSegment> Buffer() {
  UniqueFd fd(::memfd_create("railyard.submit-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_EQ(::fallocate(fd.get(), 0, 0, kBufferBytes), 0);
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  absl::StatusOr<std::shared_ptr<MappedSegment>> seg =
      MappedSegment::MapMemfd(std::move(fd), kBufferBytes);
  EXPECT_TRUE(seg.ok()) << seg.status();
  return *seg;
}

struct Rank {
  std::shared_ptr<Session> session;
  std::shared_ptr<MappedSegment> buffer;
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  float* floats() const { return reinterpret_cast<float*>(buffer->data()); }
  std::atomic<uint32_t>* ready() const {
    return reinterpret_cast<std::atomic<uint32_t>*>(buffer->data() + kWordsOffset);
  }
  std::atomic<uint32_t>* done() const {
    return reinterpret_cast<std::atomic<uint32_t>*>(buffer->data() + kWordsOffset + 4);
  }
};

class SubmitPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CommEnv env;
    env.executor = &executor_;
    env.timer = &timer_;
    env.op_timeout = absl::Seconds(30);
    comm_ = std::make_shared<Communicator>("c1", "job", 2, env);
    for (int r = 0; r < 2; ++r) {
      Rank rank;
      rank.session = std::make_shared<Session>("s" + std::to_string(r), "job", ::getpid(), "unit");
      rank.buffer = Buffer();
      ASSERT_TRUE(rank.session->AddBuffer(kBuffer, rank.buffer).ok());
      ASSERT_TRUE(
          comm_->Join(r, absl::Seconds(10), [](const absl::Status& s) { EXPECT_TRUE(s.ok()) << s; })
              .ok());
      ASSERT_TRUE(rank.session->AddMembership(kHandle, {comm_, r}).ok());
      ranks_.push_back(std::move(rank));
    }
  }
  void TearDown() override {
    path_.Stop();
    comm_->Abort(absl::CancelledError("test over"));
  }

  // An in-place float sum of the first `count` floats of the rank's buffer.
  v1::SubmitRequest AllReduce(uint64_t request_id, uint64_t count = 4) {
    v1::SubmitRequest req;
    req.set_comm_handle(kHandle);
    req.set_request_id(request_id);
    req.set_op(v1::COLLECTIVE_OP_ALL_REDUCE);
    req.set_dtype(v1::DATA_TYPE_FLOAT32);
    req.set_red_op(v1::RED_OP_SUM);
    req.set_count(count);
    req.mutable_send()->set_buffer_id(kBuffer);
    req.mutable_recv()->set_buffer_id(kBuffer);
    return req;
  }
  static void WithStream(v1::SubmitRequest& req, uint32_t value) {
    req.mutable_stream_sync()->mutable_words()->set_buffer_id(kBuffer);
    req.mutable_stream_sync()->mutable_words()->set_offset(kWordsOffset);
    req.mutable_stream_sync()->set_value(value);
  }

  testing::FakeClock clock_;
  DeadlineTimer timer_{&clock_};
  scheduler::Executor executor_{2};
  std::shared_ptr<Communicator> comm_;
  std::vector<Rank> ranks_;
  SubmitPath path_{
      {.op_timeout = absl::Seconds(30), .gate_poll = absl::Microseconds(50), .held = {}},
      &executor_};
};

TEST_F(SubmitPathTest, RoutesARequestToItsCommunicatorAndItsCompletionToTheSink) {
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 4; ++i) ranks_[r].floats()[i] = static_cast<float>((r + 1) * (i + 1));
  }
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<uint64_t> seq =
        path_.Submit(ranks_[r].session, AllReduce(10 + r), ranks_[r].sink);
    ASSERT_TRUE(seq.ok()) << seq.status();
    EXPECT_EQ(*seq, 0u);  // the communicator's first operation
  }
  for (int r = 0; r < 2; ++r) {
    const testing::Completion c = ranks_[r].sink->Wait(10 + r);
    ASSERT_TRUE(c.status.ok()) << c.status;
    EXPECT_EQ(c.seq, 0u);
    EXPECT_EQ(ranks_[r].sink->Count(10 + r), 1u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(ranks_[r].floats()[i], 3.0f * (i + 1)) << r << " " << i;
  }
  EXPECT_EQ(path_.held(), 0u);
}

TEST_F(SubmitPathTest, AnUnknownHandleIsRefusedAndLetsItsStreamGo) {
  v1::SubmitRequest req = AllReduce(20);
  req.set_comm_handle(99);
  WithStream(req, 5);
  absl::StatusOr<uint64_t> seq = path_.Submit(ranks_[0].session, req, ranks_[0].sink);
  EXPECT_EQ(seq.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(seq.status().message(), HasSubstr("comm handle 99"));
  EXPECT_EQ(ranks_[0].done()->load(), 5u) << "a refused request must store its done word";
  EXPECT_EQ(ranks_[0].sink->Count(20), 0u) << "a refused request has no completion";
}

TEST_F(SubmitPathTest, ARequestOutsideItsBufferIsRefusedBeforeAnythingRuns) {
  v1::SubmitRequest req = AllReduce(21, kBufferBytes);  // 4 x 4096 bytes of a 4096-byte buffer
  WithStream(req, 3);
  absl::StatusOr<uint64_t> seq = path_.Submit(ranks_[0].session, req, ranks_[0].sink);
  ASSERT_FALSE(seq.ok());
  EXPECT_EQ(seq.status().code(), absl::StatusCode::kInvalidArgument) << seq.status();
  EXPECT_EQ(ranks_[0].done()->load(), 3u);
  EXPECT_EQ(comm_->Stats().ops_completed, 0u);
  EXPECT_EQ(path_.held(), 0u);
}

TEST_F(SubmitPathTest, ARequestWaitsForItsStreamThenRuns) {
  // A first operation (seq 0), so that the held one's seq (1) differs from Submit's 0 for held.
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(path_.Submit(ranks_[r].session, AllReduce(28 + r, 1), ranks_[r].sink).ok());
  }
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(ranks_[r].sink->Wait(28 + r).status.ok());
  ranks_[0].ready()->store(0);
  for (int r = 0; r < 2; ++r) ranks_[r].floats()[0] = 1.0f + r;
  v1::SubmitRequest gated = AllReduce(30, 1);
  WithStream(gated, 1);
  absl::StatusOr<uint64_t> held = path_.Submit(ranks_[0].session, gated, ranks_[0].sink);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, 0u) << "a held request's seq comes with its completion";
  EXPECT_EQ(path_.held(), 1u);
  ASSERT_TRUE(path_.Submit(ranks_[1].session, AllReduce(31, 1), ranks_[1].sink).ok());
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ranks_[0].sink->Count(30), 0u) << "ran before its stream reached it";
  EXPECT_EQ(ranks_[0].floats()[0], 1.0f);

  ranks_[0].ready()->store(1);  // the client's stream reaches the operation
  const testing::Completion c = ranks_[0].sink->Wait(30);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.seq, 1u);
  EXPECT_EQ(ranks_[0].done()->load(), 1u);
  EXPECT_EQ(ranks_[0].floats()[0], 3.0f);
  EXPECT_TRUE(ranks_[1].sink->Wait(31).status.ok());
  // The gate pops the item once its release has returned, which may be just after the
  // completion arrived.
  for (int i = 0; i < 2000 && path_.held() != 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(path_.held(), 0u);
}

TEST_F(SubmitPathTest, WhatASessionHoldsFailsWhenItIsDropped) {
  v1::SubmitRequest gated = AllReduce(40, 1);
  WithStream(gated, 9);
  ASSERT_TRUE(path_.Submit(ranks_[0].session, gated, ranks_[0].sink).ok());
  ASSERT_EQ(path_.held(), 1u);
  path_.DropHeld(*ranks_[0].session, kHandle, absl::CancelledError("rank 0 destroyed c1"));
  const testing::Completion c = ranks_[0].sink->Wait(40);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(c.status.message(), HasSubstr("rank 0 destroyed c1"));
  EXPECT_EQ(ranks_[0].done()->load(), 9u);
  EXPECT_EQ(path_.held(), 0u);
}

TEST_F(SubmitPathTest, StopFailsWhatIsHeldAndRefusesWhatWouldBe) {
  v1::SubmitRequest gated = AllReduce(50, 1);
  WithStream(gated, 2);
  ASSERT_TRUE(path_.Submit(ranks_[0].session, gated, ranks_[0].sink).ok());
  path_.Stop();
  EXPECT_EQ(ranks_[0].sink->Wait(50).status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ranks_[0].done()->load(), 2u);
  ranks_[0].done()->store(0);
  v1::SubmitRequest later = AllReduce(51, 1);
  WithStream(later, 4);
  absl::StatusOr<uint64_t> refused = path_.Submit(ranks_[0].session, later, ranks_[0].sink);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ranks_[0].done()->load(), 4u);
  path_.Stop();  // idempotent
}

TEST_F(SubmitPathTest, ABatchKeepsItsOrderAndRefusesOnlyItsBadRequests) {
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 3; ++i) ranks_[r].floats()[i] = 1.0f;
  }
  std::vector<v1::SubmitRequest> reqs = {AllReduce(60, 1), AllReduce(61, 1), AllReduce(62, 1)};
  reqs[1].set_comm_handle(99);
  std::vector<const v1::SubmitRequest*> ptrs;
  for (const auto& r : reqs) ptrs.push_back(&r);
  std::vector<absl::StatusOr<uint64_t>> got =
      path_.SubmitBatch(ranks_[0].session, ptrs, ranks_[0].sink);
  ASSERT_EQ(got.size(), 3u);
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_EQ(got[1].status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(got[2].ok()) << got[2].status();
  EXPECT_EQ(*got[0], 0u);
  EXPECT_EQ(*got[2], 1u);
  ASSERT_TRUE(path_.Submit(ranks_[1].session, AllReduce(70, 1), ranks_[1].sink).ok());
  ASSERT_TRUE(path_.Submit(ranks_[1].session, AllReduce(71, 1), ranks_[1].sink).ok());
  EXPECT_TRUE(ranks_[0].sink->Wait(60).status.ok());
  EXPECT_TRUE(ranks_[0].sink->Wait(62).status.ok());
  EXPECT_EQ(ranks_[0].sink->Count(61), 0u);
  EXPECT_TRUE(ranks_[1].sink->Wait(71).status.ok());
  EXPECT_EQ(ranks_[0].floats()[0], 4.0f) << "two sums of 1 + 1, in place";
}

}  // namespace
}  // namespace railyard
