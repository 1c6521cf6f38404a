// CommJoins on its own, in one process: real sessions, registry, bootstrap and factory, a fake
// clock and a fake of the calls to other daemons. Local ranks join one communicator built once;
// what is wrong with a join is refused at once with what and why; a join through another daemon
// asks that coordinator with this node's description and hands its answer to the rank.
#include "daemon/core/comm_joins.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/comm/comm_id.h"
#include "daemon/scheduler/executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fakes.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

// Records joins sent to other coordinators and answers them with `answer`.
class FakeCoordinators : public PeerCalls {
 public:
  void JoinComm(const std::string& address, const v1::JoinCommRequest& req, absl::Duration,
                JoinDone done) override {
    {
      absl::MutexLock lock(&mu_);
      asked.push_back(address);
      sent.push_back(req);
    }
    done(answer);
  }
  void AbortComm(const std::string&, const std::string&, const v1::AbortCommRequest&) override {}
  void Heartbeat(const std::string&, const std::string&, const std::string&, absl::Duration,
                 std::function<void(const absl::Status&)> done) override {
    done(absl::OkStatus());
  }
  void GetCommState(const std::string&, const std::string&, const v1::PeerCommStateRequest&,
                    absl::Duration,
                    std::function<void(const absl::StatusOr<v1::CommState>&)> done) override {
    done(absl::UnimplementedError("not in this test"));
  }

  absl::Mutex mu_;
  std::vector<std::string> asked;
  std::vector<v1::JoinCommRequest> sent;
  absl::StatusOr<v1::JoinCommResponse> answer = absl::UnavailableError("coordinator unreachable");
};

// What one InitComm's done reported.
struct Joined {
  absl::Notification done;
  absl::Status status;
  uint64_t handle = 0;
  int nnodes = -1;
  CommJoins::InitDone Fn() {
    return [this](const absl::Status& s, uint64_t h, int n, uint64_t /*first_seq*/) {
      status = s;
      handle = h;
      nnodes = n;
      done.Notify();
    };
  }
  bool Wait() { return done.WaitForNotificationWithTimeout(absl::Seconds(10)); }
};

DaemonConfig UnitConfig() {
  DaemonConfig config;
  config.node_name = "unit";
  return config;
}

class CommJoinsTest : public ::testing::Test {
 protected:
  std::shared_ptr<Session> NewSession(const std::string& job = "job") {
    return std::make_shared<Session>("s" + std::to_string(++sessions_), job, ::getpid(), "unit");
  }
  v1::InitCommRequest Init(const std::string& comm_id, int rank, int nranks) {
    v1::InitCommRequest req;
    req.set_comm_id(comm_id);
    req.set_rank(rank);
    req.set_nranks(nranks);
    return req;
  }

  const DaemonConfig config_ = UnitConfig();
  testing::FakeClock clock_;
  DeadlineTimer timer_{&clock_};
  scheduler::Executor executor_{1};
  CommRegistry comms_;
  FakeCoordinators peers_;
  CommBootstrap bootstrap_{&timer_, {16}};
  DaemonCommFactory factory_{
      config_, {&executor_, &timer_, nullptr, &peers_}, transport::LinkStack()};
  PeerPlane plane_{{"unit"}, {&comms_, nullptr, &peers_, &timer_, nullptr}};
  Tuning tuning_{"/nonexistent-state-dir", &comms_, nullptr};
  FairShare fair_{"", {}};
  CommJoins joins_{config_, {&comms_, &factory_, &bootstrap_, &peers_, &plane_, &tuning_, &fair_}};
  int sessions_ = 0;
};

TEST_F(CommJoinsTest, LocalRanksJoinOneCommunicatorBuiltOnce) {
  const std::string id = joins_.NewCommId();
  EXPECT_THAT(id, HasSubstr("@local:unit"));
  auto a = NewSession(), b = NewSession();
  Joined ja, jb;
  ASSERT_TRUE(joins_.InitComm(a, Init(id, 0, 2), ja.Fn()).ok());
  ASSERT_TRUE(joins_.InitComm(b, Init(id, 1, 2), jb.Fn()).ok());
  ASSERT_TRUE(ja.Wait());
  ASSERT_TRUE(jb.Wait());
  ASSERT_TRUE(ja.status.ok()) << ja.status;
  ASSERT_TRUE(jb.status.ok()) << jb.status;
  EXPECT_EQ(ja.nnodes, 1);
  EXPECT_NE(ja.handle, jb.handle);
  ASSERT_EQ(comms_.Snapshot().size(), 1u);
  absl::StatusOr<Membership> ma = a->FindMembership(ja.handle);
  absl::StatusOr<Membership> mb = b->FindMembership(jb.handle);
  ASSERT_TRUE(ma.ok() && mb.ok());
  EXPECT_EQ(ma->comm, mb->comm) << "both ranks must be members of the one communicator";
  EXPECT_EQ(ma->rank, 0);
  EXPECT_EQ(mb->rank, 1);
  EXPECT_TRUE(peers_.asked.empty()) << "a comm id of this daemon's is coordinated here";

  Joined again;
  absl::Status twice = joins_.InitComm(a, Init(id, 0, 2), again.Fn());
  EXPECT_EQ(twice.code(), absl::StatusCode::kAlreadyExists) << twice;
  for (auto& c : comms_.Close()) c->Abort(absl::CancelledError("test over"));
}

TEST_F(CommJoinsTest, WhatIsWrongWithAJoinIsRefusedAtOnce) {
  auto s = NewSession();
  Joined never;
  absl::Status bad_id = joins_.InitComm(s, Init("not-a-comm-id", 0, 1), never.Fn());
  EXPECT_EQ(bad_id.code(), absl::StatusCode::kInvalidArgument);

  const std::string id = joins_.NewCommId();
  EXPECT_EQ(joins_.InitComm(s, Init(id, 2, 2), never.Fn()).code(),
            absl::StatusCode::kInvalidArgument);

  const std::string other_local = FormatCommId({RandomHex128(), "local:elsewhere"});
  absl::Status local = joins_.InitComm(s, Init(other_local, 0, 1), never.Fn());
  EXPECT_EQ(local.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(local.message(), HasSubstr("local:elsewhere"));

  const std::string remote = FormatCommId({RandomHex128(), "10.0.0.9:7070"});
  absl::Status no_peer = joins_.InitComm(s, Init(remote, 0, 2), never.Fn());
  EXPECT_EQ(no_peer.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(no_peer.message(), HasSubstr("--peer_listen"));

  joins_.Shutdown();
  EXPECT_EQ(joins_.InitComm(s, Init(id, 0, 1), never.Fn()).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(never.done.HasBeenNotified()) << "a refused join must not also call done";
  EXPECT_TRUE(comms_.Snapshot().empty());
}

TEST_F(CommJoinsTest, AJoinThroughAnotherDaemonAsksItsCoordinatorAndPassesOnItsAnswer) {
  joins_.SetFabric(nullptr, "10.0.0.1:7070");
  EXPECT_EQ(joins_.coordinator(), "10.0.0.1:7070");
  const std::string remote = FormatCommId({RandomHex128(), "10.0.0.9:7070"});
  auto s = NewSession();
  Joined joined;
  v1::InitCommRequest req = Init(remote, 1, 2);
  req.set_integrity("crc32c");
  ASSERT_TRUE(joins_.InitComm(s, req, joined.Fn()).ok());
  ASSERT_TRUE(joined.Wait());
  EXPECT_EQ(joined.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(joined.status.message(), HasSubstr("coordinator unreachable"));
  ASSERT_EQ(peers_.asked.size(), 1u);
  EXPECT_EQ(peers_.asked[0], "10.0.0.9:7070");
  const v1::JoinCommRequest& sent = peers_.sent[0];
  EXPECT_EQ(sent.job_id(), "job");
  EXPECT_EQ(sent.rank(), 1);
  EXPECT_EQ(sent.nranks(), 2);
  EXPECT_EQ(sent.integrity(), "crc32c");
  EXPECT_EQ(sent.node().node_name(), "unit");
  EXPECT_EQ(sent.node().peer_address(), "10.0.0.1:7070");
  EXPECT_FALSE(s->FindMembership(joined.handle).ok()) << "a failed join leaves no membership";
}

}  // namespace
}  // namespace railyard
