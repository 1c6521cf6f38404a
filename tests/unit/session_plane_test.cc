// SessionPlane on its own, in one process: real registries, submit path and communicators, no
// gRPC and no side channel. What a session's buffers, rings and communicators refuse (each with
// what and why), and what a session's end does to the communicators it was a rank of.
#include "daemon/core/session_plane.h"

#include <unistd.h>

#include <memory>
#include <string>

#include "daemon/scheduler/executor.h"
#include "daemon/util/deadline_timer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fakes.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

DaemonConfig UnitConfig() {
  DaemonConfig config;
  config.node_name = "unit";
  return config;
}

SessionAuth FirstSessionSetsToken() {
  SessionAuth auth;
  auth.first_session_sets_token = true;
  return auth;
}

class SessionPlaneTest : public ::testing::Test {
 protected:
  void TearDown() override {
    path_.Stop();
    for (auto& c : comms_.Close()) c->Abort(absl::CancelledError("test over"));
  }

  std::shared_ptr<Session> Open(const std::string& job = "job") {
    absl::StatusOr<std::shared_ptr<Session>> s =
        sessions_.Open(job, "token", {::getpid(), ::getuid(), ::getgid()}, "unit");
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }

  const DaemonConfig config_ = UnitConfig();
  testing::FakeClock clock_;
  DeadlineTimer timer_{&clock_};
  scheduler::Executor executor_{1};
  SessionRegistry sessions_{FirstSessionSetsToken(), &config_.quotas};
  CommRegistry comms_;
  SubmitPath path_{{}, &executor_};
  RingPollers pollers_{RingPollers::Mode::kPerJob};
  SessionPlane plane_{config_, {&sessions_, &comms_, &path_, &pollers_, nullptr}};
};

TEST_F(SessionPlaneTest, AConnectNeedsItsSideChannel) {
  v1::ConnectRequest req;
  req.set_job_id("job");
  EXPECT_EQ(plane_.Open(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_fd_ticket("0123");
  absl::StatusOr<std::shared_ptr<Session>> no_channel = plane_.Open(req);
  EXPECT_EQ(no_channel.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(no_channel.status().message(), HasSubstr("side channel"));
}

TEST_F(SessionPlaneTest, ABufferIsRefusedSayingWhy) {
  std::shared_ptr<Session> s = Open();
  absl::StatusOr<uint64_t> both = plane_.RegisterBuffer(*s, 3, 4096, v1::MEMORY_KIND_CUDA, 0, "h");
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<uint64_t> ipc_off =
      plane_.RegisterBuffer(*s, 0, 4096, v1::MEMORY_KIND_CUDA, 0, "handle");
  EXPECT_EQ(ipc_off.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(ipc_off.status().message(), HasSubstr("--cuda_ipc"));
  absl::StatusOr<uint64_t> no_channel = plane_.RegisterBuffer(*s, 1, 4096);
  EXPECT_EQ(no_channel.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_channel.status().message(), HasSubstr("side channel"));
  EXPECT_EQ(plane_.ReleaseBuffer(*s, 77).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->buffer_count(), 0u);
}

TEST_F(SessionPlaneTest, RingsAndCommunicatorsTheSessionDoesNotHaveAreRefused) {
  std::shared_ptr<Session> s = Open();
  absl::Status rings = plane_.OpenRings(s, 1, 64, 64);
  EXPECT_EQ(rings.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(rings.message(), HasSubstr("side channel"));
  absl::Status destroy = plane_.DestroyComm(*s, 42);
  EXPECT_EQ(destroy.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(destroy.message(), HasSubstr("42"));
}

TEST_F(SessionPlaneTest, ASessionsEndFailsItsCommunicatorsForTheOtherRanksAndIsIdempotent) {
  CommEnv env;
  env.executor = &executor_;
  env.timer = &timer_;
  auto comm = std::make_shared<Communicator>("c1", "job", 2, env);
  std::shared_ptr<Communicator> found;
  ASSERT_EQ(comms_.FindOrClaim({"job", "c1"}, nullptr, &found), CommRegistry::Claim::kBuild);
  absl::StatusOr<std::shared_ptr<Communicator>> made = comm;
  comms_.Built({"job", "c1"}, made);
  ASSERT_EQ(comms_.Snapshot().size(), 1u);
  std::shared_ptr<Session> a = Open(), b = Open();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(comm->Join(r, absl::Seconds(10), [](const absl::Status&) {}).ok());
  }
  ASSERT_TRUE(a->AddMembership(1, {comm, 0}).ok());
  ASSERT_TRUE(b->AddMembership(1, {comm, 1}).ok());
  // Rank 1 waits in a barrier for rank 0, whose process then goes away.
  auto sink = std::make_shared<testing::RecordingSink>();
  auto barrier = std::make_unique<PendingRequest>();
  barrier->request_id = 9;
  barrier->rank = 1;
  barrier->session = sink;
  barrier->req.op = scheduler::OpKind::kBarrier;
  ASSERT_TRUE(comm->Submit(std::move(barrier)).ok());

  plane_.Close(a, "client disconnected", grpc::Status::CANCELLED);
  EXPECT_TRUE(a->closed());
  EXPECT_FALSE(sessions_.Find(a->id()).ok());
  const testing::Completion c = sink->Wait(9);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(c.status.message(), HasSubstr("rank 0 of communicator c1"));
  EXPECT_THAT(c.status.message(), HasSubstr("client disconnected"));
  plane_.Close(a, "again", grpc::Status::CANCELLED);  // idempotent
  EXPECT_EQ(sink->Count(9), 1u);

  // The last rank leaving retires the communicator.
  ASSERT_TRUE(plane_.DestroyComm(*b, 1).ok());
  EXPECT_TRUE(comms_.Snapshot().empty());
}

}  // namespace
}  // namespace railyard
