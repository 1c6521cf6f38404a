// PeerPlane on its own: a registry holding this node's side of a two-node communicator (over the
// in-process transport), a fake clock and a fake of the calls to other daemons. Heartbeats go
// where live communicators need them and a silent node fails them at --peer_timeout; heartbeats,
// aborts and views are answered only for member nodes; diagnosis gathers every member's view.
#include "daemon/core/peer_plane.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/comm/communicator.h"
#include "daemon/comm/pending_request.h"
#include "daemon/scheduler/executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fakes.h"
#include "tests/unit/inproc_nodes.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

// Records the calls to other daemons; heartbeats and state requests are answered by the test.
class FakePeers : public PeerCalls {
 public:
  void JoinComm(const std::string& address, const v1::JoinCommRequest&, absl::Duration,
                JoinDone done) override {
    done(absl::UnavailableError("no coordinator at " + address + " in this test"));
  }
  void AbortComm(const std::string& address, const std::string& node,
                 const v1::AbortCommRequest& req) override {
    absl::MutexLock lock(&mu_);
    aborts.push_back(address + " " + node + " " + req.comm_id());
  }
  void Heartbeat(const std::string& address, const std::string& node, const std::string& from,
                 absl::Duration, std::function<void(const absl::Status&)> done) override {
    absl::Status answer;
    {
      absl::MutexLock lock(&mu_);
      heartbeats.push_back(address + " " + node + " from " + from);
      answer =
          silent.count(address) ? absl::UnavailableError("connection refused") : absl::OkStatus();
    }
    done(answer);
  }
  void GetCommState(const std::string& address, const std::string& node,
                    const v1::PeerCommStateRequest& req, absl::Duration,
                    std::function<void(const absl::StatusOr<v1::CommState>&)> done) override {
    {
      absl::MutexLock lock(&mu_);
      state_asks.push_back(address + " " + node + " " + req.comm_id() + " from " + req.from_node());
    }
    if (silent.count(address)) return done(absl::DeadlineExceededError("no answer"));
    v1::CommState st;
    st.set_node_name(node);
    st.set_comm_id(req.comm_id());
    st.set_node_index(address == "10.0.0.1:7070" ? 1 : 0);  // the layouts' node1
    if (address == "10.0.0.1:7070") {
      v1::RankProgress* r = st.add_ranks();
      r->set_rank(1);
      r->set_left(rank1_left);
    }
    done(st);
  }
  std::vector<std::string> Heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats;
  }

  absl::Mutex mu_;
  std::vector<std::string> aborts, heartbeats, state_asks;
  std::set<std::string> silent;  // addresses that do not answer
  bool rank1_left = false;       // node1's view of its rank 1
};

PeerIdentity Claims() { return PeerIdentity{}; }  // --peer_insecure: trusted as claimed

class PeerPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override { comm_ = Register("job", "ry1-c@10.0.0.0:7070"); }
  void TearDown() override {
    plane_.Stop();
    for (auto& c : comms_.Close()) c->Abort(absl::CancelledError("test over"));
  }

  // node0's side of a communicator of node0 and node1 (one rank each), registered.
  std::shared_ptr<Communicator> Register(const std::string& job, const std::string& id) {
    MultiNodeEnv net;
    net.layout = scheduler::CommLayout::Uniform(2, 1, 1);
    net.my_node = 0;
    net.node_names = {"node0", "node1"};
    net.node_addresses = {"10.0.0.0:7070", "10.0.0.1:7070"};
    net.endpoints.assign(2, {});
    net.endpoints[1].resize(1);
    net.endpoints[1][0] = nodes_.Connect(0, 1);
    net.node_slots = {1, 2};
    net.notify_peers = [this](const absl::Status& status, std::optional<uint64_t> unrun_seq) {
      absl::MutexLock lock(&peers_.mu_);
      notices_.push_back({status.code(), unrun_seq});
    };
    CommEnv env;
    env.executor = &executor_;
    env.timer = &timer_;
    env.default_algo = "ring";  // no tuner here
    auto comm = std::make_shared<Communicator>(id, job, env, std::move(net));
    std::shared_ptr<Communicator> found;
    const CommRegistry::Key key(job, id);
    EXPECT_EQ(comms_.FindOrClaim(key, nullptr, &found), CommRegistry::Claim::kBuild);
    absl::StatusOr<std::shared_ptr<Communicator>> made = comm;
    comms_.Built(key, made);
    return comm;
  }

  // Rank 0 (this node's) joins comm and submits an AllReduce that waits for node1's rank, which
  // never comes: its completion carries whatever fails the communicator.
  uint64_t Pending(const std::shared_ptr<Communicator>& comm) {
    EXPECT_TRUE(comm->Join(0, absl::Seconds(100), [](const absl::Status&) {}).ok());
    static uint64_t next_id = 1;
    const uint64_t id = next_id++;
    auto p = std::make_unique<PendingRequest>();
    p->request_id = id;
    p->rank = 0;
    p->session = sink_;
    p->req.op = scheduler::OpKind::kAllReduce;
    p->req.dtype = kernels::DataType::kFloat32;
    p->req.red_op = kernels::RedOp::kSum;
    p->req.count = data_.size();
    p->req.send = reinterpret_cast<std::byte*>(data_.data());
    p->req.recv = reinterpret_cast<std::byte*>(data_.data());
    EXPECT_TRUE(comm->Submit(std::move(p)).ok());
    return id;
  }

  // Peer.AbortComm from `from` about comm: failed with code and message.
  v1::AbortCommRequest Notice(const std::shared_ptr<Communicator>& comm, const std::string& from,
                              absl::StatusCode code, const std::string& message) {
    v1::AbortCommRequest abort;
    abort.set_job_id("job");
    abort.set_comm_id(comm->comm_id());
    abort.set_from_node(from);
    abort.set_code(static_cast<int>(code));
    abort.set_message(message);
    return abort;
  }

  std::vector<float> data_ = std::vector<float>(16, 1.0f);
  std::shared_ptr<testing::RecordingSink> sink_ = std::make_shared<testing::RecordingSink>();
  testing::FakeClock clock_;
  DeadlineTimer timer_{&clock_};
  scheduler::Executor executor_{1};
  testing::InProcNodes nodes_;
  CommRegistry comms_;
  FakePeers peers_;
  PeerPlane plane_{{"node0", absl::Seconds(1), absl::Seconds(10)},
                   {&comms_, nullptr, &peers_, &timer_, nullptr}};
  std::shared_ptr<Communicator> comm_;
  // What this node's communicators told the other daemons (Peer.AbortComm): code, unrun_seq.
  std::vector<std::pair<absl::StatusCode, std::optional<uint64_t>>> notices_;
};

TEST_F(PeerPlaneTest, HeartbeatsGoEveryIntervalToTheNodesLiveCommunicatorsNeed) {
  plane_.Start();
  EXPECT_TRUE(peers_.Heartbeats().empty());
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(timer_.RunDue(), 1);
  EXPECT_THAT(peers_.Heartbeats(), ::testing::ElementsAre("10.0.0.1:7070 node1 from node0"));
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(timer_.RunDue(), 1);
  EXPECT_EQ(peers_.Heartbeats().size(), 2u);
  EXPECT_FALSE(comm_->failed());
  plane_.Stop();
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(timer_.RunDue(), 0) << "heartbeats went on after Stop";
}

TEST_F(PeerPlaneTest, ANodeSilentForThePeerTimeoutFailsItsCommunicatorsSayingWhy) {
  const uint64_t op = Pending(comm_);
  peers_.silent.insert("10.0.0.1:7070");
  plane_.Start();
  // The first round (at 1 s) starts the node's clock: it is dead once 10 s have passed since.
  for (int s = 1; s <= 11; ++s) {
    clock_.Advance(absl::Seconds(1));
    timer_.RunDue();
    ASSERT_FALSE(comm_->failed()) << "failed at " << s << " s, before the 10 s timeout";
  }
  clock_.Advance(absl::Seconds(1));
  timer_.RunDue();
  ASSERT_TRUE(comm_->failed());
  const absl::Status why = sink_->Wait(op).status;
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(why.message(), HasSubstr("node node1 (10.0.0.1:7070)"));
  EXPECT_THAT(why.message(), HasSubstr("connection refused"));
}

TEST_F(PeerPlaneTest, HeartbeatsAreAnsweredOnlyForMemberNodesAndNodesBeingBuilt) {
  v1::HeartbeatRequest hb;
  hb.set_from_node("node1");
  absl::StatusOr<v1::HeartbeatResponse> member = plane_.Heartbeat(Claims(), hb);
  ASSERT_TRUE(member.ok()) << member.status();
  EXPECT_EQ(member->node_name(), "node0");

  hb.set_from_node("node7");
  EXPECT_EQ(plane_.Heartbeat(Claims(), hb).status().code(), absl::StatusCode::kPermissionDenied);
  plane_.CountBuilding({"node7"}, +1);
  EXPECT_TRUE(plane_.Heartbeat(Claims(), hb).ok()) << "a node whose communicator is being built";
  plane_.CountBuilding({"node7"}, -1);
  EXPECT_EQ(plane_.Heartbeat(Claims(), hb).status().code(), absl::StatusCode::kPermissionDenied);

  hb.set_from_node("bad name!");
  EXPECT_EQ(plane_.Heartbeat(Claims(), hb).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PeerPlaneTest, APeersAbortFailsTheCommunicatorOnlyFromAMemberNode) {
  const uint64_t op = Pending(comm_);
  v1::AbortCommRequest abort =
      Notice(comm_, "node9", absl::StatusCode::kDataLoss, std::string(5000, 'x'));
  EXPECT_EQ(plane_.AbortFromPeer(Claims(), abort).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(comm_->failed());

  abort.set_from_node("node1");
  ASSERT_TRUE(plane_.AbortFromPeer(Claims(), abort).ok());
  ASSERT_TRUE(comm_->failed());
  // A peer's abort leaves the running operation a grace period (on the timer) to finish.
  clock_.Advance(absl::Minutes(10));
  timer_.RunDue();
  const absl::Status why = sink_->Wait(op).status;
  EXPECT_EQ(why.code(), absl::StatusCode::kDataLoss) << why;
  EXPECT_LE(why.message().size(), 1024u + 200u) << "a peer's message is bounded";

  auto other = Register("job", "ry1-d@10.0.0.0:7070");
  const uint64_t other_op = Pending(other);
  abort.set_comm_id(other->comm_id());
  abort.set_code(999);  // not a status code
  ASSERT_TRUE(plane_.AbortFromPeer(Claims(), abort).ok());
  clock_.Advance(absl::Minutes(10));
  timer_.RunDue();
  EXPECT_EQ(sink_->Wait(other_op).status.code(), absl::StatusCode::kAborted);
}

// departed_ranks: only the sender's own ranks; a clean departure fails only what needs them.
TEST_F(PeerPlaneTest, ADepartureNoticeNamesOnlyTheSendersRanks) {
  v1::AbortCommRequest notice =
      Notice(comm_, "node1", absl::StatusCode::kAborted, "rank 1 destroyed communicator");
  notice.add_departed_ranks(0);  // node0's (this daemon's) rank
  absl::Status s = plane_.AbortFromPeer(Claims(), notice);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("is not a rank of node node1"));
  notice.set_departed_ranks(0, 7);  // no such rank
  EXPECT_EQ(plane_.AbortFromPeer(Claims(), notice).code(), absl::StatusCode::kInvalidArgument);
  for (int i = 0; i < 5; ++i) notice.add_departed_ranks(1);  // more than the communicator has
  EXPECT_EQ(plane_.AbortFromPeer(Claims(), notice).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(comm_->failed());

  notice.clear_departed_ranks();
  notice.add_departed_ranks(1);
  ASSERT_TRUE(plane_.AbortFromPeer(Claims(), notice).ok());
  EXPECT_FALSE(comm_->failed());                    // nothing waited for rank 1
  EXPECT_TRUE(comm_->LivePeerAddresses().empty());  // and node1 is heartbeated no more
  ASSERT_TRUE(comm_->Join(0, absl::Seconds(100), [](const absl::Status&) {}).ok());
  auto p = std::make_unique<PendingRequest>();
  p->request_id = 99;
  p->rank = 0;
  p->session = sink_;
  p->req.op = scheduler::OpKind::kAllReduce;
  p->req.dtype = kernels::DataType::kFloat32;
  p->req.count = data_.size();
  p->req.send = p->req.recv = reinterpret_cast<std::byte*>(data_.data());
  const auto refused = comm_->Submit(std::move(p));  // a collective needs rank 1
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("rank 1 destroyed communicator"));
  EXPECT_TRUE(comm_->failed());
}

TEST_F(PeerPlaneTest, ViewsAreFilteredAndRefusedToNonMembers) {
  v1::GetCommStateRequest all;
  absl::StatusOr<v1::GetCommStateResponse> got = plane_.GetCommState(all);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->comms_size(), 1);
  EXPECT_EQ(got->comms(0).node_name(), "node0");
  v1::GetCommStateRequest none;
  none.set_job_id("nobody");
  EXPECT_EQ(plane_.GetCommState(none).status().code(), absl::StatusCode::kNotFound);

  v1::PeerCommStateRequest peer;
  peer.set_job_id("job");
  peer.set_comm_id(comm_->comm_id());
  peer.set_from_node("node1");
  EXPECT_TRUE(plane_.PeerCommState(Claims(), peer).ok());
  peer.set_from_node("node5");
  EXPECT_EQ(plane_.PeerCommState(Claims(), peer).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(PeerPlaneTest, DiagnosisAsksEveryOtherMemberAndNamesTheSilentOnes) {
  v1::DiagnoseRequest req;
  req.set_job_id("job");
  auto run = [&] {
    absl::Notification done;
    absl::StatusOr<v1::DiagnoseResponse> out;
    plane_.Diagnose(req, [&](const absl::StatusOr<v1::DiagnoseResponse>& r) {
      out = r;
      done.Notify();
    });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    return out;
  };
  absl::StatusOr<v1::DiagnoseResponse> answered = run();
  ASSERT_TRUE(answered.ok()) << answered.status();
  ASSERT_EQ(answered->comms_size(), 1);
  EXPECT_THAT(peers_.state_asks,
              ::testing::ElementsAre("10.0.0.1:7070 node1 " + comm_->comm_id() + " from node0"));

  peers_.silent.insert("10.0.0.1:7070");
  absl::StatusOr<v1::DiagnoseResponse> silent = run();
  ASSERT_TRUE(silent.ok()) << silent.status();
  EXPECT_THAT(silent->comms(0).DebugString(), HasSubstr("node1"));
  EXPECT_THAT(silent->comms(0).DebugString(), HasSubstr("DEADLINE_EXCEEDED"));

  req.set_timeout_ms(60000);
  EXPECT_EQ(run().status().code(), absl::StatusCode::kInvalidArgument);
  v1::DiagnoseRequest empty;
  req = empty;
  EXPECT_EQ(run().status().code(), absl::StatusCode::kInvalidArgument);
}

// A peer's notice that it will not run a collective (unrun_seq): a run here of that collective
// waits for its part in vain, so it fails at once; a notice about a later one leaves the grace.
TEST_F(PeerPlaneTest, APeersUnrunSeqFailsTheRunningCollectiveAtOnceNotAfterTheGrace) {
  const uint64_t running = Pending(comm_);
  v1::AbortCommRequest abort =
      Notice(comm_, "node1", absl::StatusCode::kUnavailable, "rank 1 left: client disconnected");
  abort.set_unrun_seq(comm_->ProgressState().front().seq() + 1);  // node1 runs this one
  ASSERT_TRUE(plane_.AbortFromPeer(Claims(), abort).ok());
  EXPECT_EQ(sink_->Wait(running, absl::Milliseconds(300)).status.code(),
            absl::StatusCode::kDeadlineExceeded)
      << "failed before the grace, though node1 runs it";
  clock_.Advance(absl::Minutes(10));
  timer_.RunDue();
  EXPECT_EQ(sink_->Wait(running).status.code(), absl::StatusCode::kUnavailable);

  auto other = Register("job", "ry1-e@10.0.0.0:7070");
  const uint64_t op = Pending(other);
  abort.set_comm_id(other->comm_id());
  abort.set_unrun_seq(other->ProgressState().front().seq());
  ASSERT_TRUE(plane_.AbortFromPeer(Claims(), abort).ok());
  const absl::Status why = sink_->Wait(op).status;  // no clock advanced
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable) << why;
  EXPECT_THAT(why.message(), HasSubstr("client disconnected"));
}

// A node that had not started the collective a peer's notice says that peer still runs tells
// the others so (once), and a node that already failed but still runs it cuts its transfers at
// such a notice instead of waiting out the grace.
TEST_F(PeerPlaneTest, ANodeThatWillNotRunTheCollectiveTellsThePeersThatStillDo) {
  ASSERT_TRUE(comm_->Join(0, absl::Seconds(100), [](const absl::Status&) {}).ok());
  const uint64_t front = comm_->ProgressState().ranks(0).completed();
  v1::AbortCommRequest abort =
      Notice(comm_, "node1", absl::StatusCode::kUnavailable, "rank 1 left: client disconnected");
  abort.set_unrun_seq(front + 1);  // node1 runs `front`; this node has not started it
  ASSERT_TRUE(plane_.AbortFromPeer(Claims(), abort).ok());
  {
    absl::MutexLock lock(&peers_.mu_);
    ASSERT_EQ(notices_.size(), 1u);
    EXPECT_EQ(notices_[0].first, absl::StatusCode::kUnavailable);
    EXPECT_EQ(notices_[0].second, std::optional<uint64_t>(front));
  }
  ASSERT_TRUE(plane_.AbortFromPeer(Claims(), abort).ok());  // told again: nothing more to say
  {
    absl::MutexLock lock(&peers_.mu_);
    EXPECT_EQ(notices_.size(), 1u);
  }

  // Told without a sequence (grace for the running one), then that a peer will not run it.
  auto other = Register("job", "ry1-f@10.0.0.0:7070");
  const uint64_t op = Pending(other);
  abort.set_comm_id(other->comm_id());
  abort.clear_unrun_seq();
  ASSERT_TRUE(plane_.AbortFromPeer(Claims(), abort).ok());
  EXPECT_EQ(sink_->Wait(op, absl::Milliseconds(300)).status.code(),
            absl::StatusCode::kDeadlineExceeded);
  abort.set_unrun_seq(other->ProgressState().front().seq());
  ASSERT_TRUE(plane_.AbortFromPeer(Claims(), abort).ok());
  EXPECT_EQ(sink_->Wait(op).status.code(), absl::StatusCode::kUnavailable);  // no clock moved
  absl::MutexLock lock(&peers_.mu_);
  EXPECT_EQ(notices_.size(), 1u) << "a node running the collective has nothing to add";
}

TEST_F(PeerPlaneTest, ACensusCountsTheRanksEachMemberStillHas) {
  std::vector<int> exclude;
  auto census = [&](uint32_t timeout_ms) {
    absl::Notification done;
    absl::StatusOr<v1::CommCensusResponse> out;
    plane_.Census(comm_, timeout_ms, exclude, [&](const absl::StatusOr<v1::CommCensusResponse>& r) {
      out = r;
      done.Notify();
    });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    return out;
  };
  ASSERT_TRUE(comm_->Join(0, absl::Seconds(100), [](const absl::Status&) {}).ok());
  absl::StatusOr<v1::CommCensusResponse> all = census(0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->lost_ranks_size(), 0);
  EXPECT_EQ(all->failure_code(), 0);
  EXPECT_EQ(all->coordinator(), "10.0.0.0:7070");

  peers_.rank1_left = true;
  absl::StatusOr<v1::CommCensusResponse> left = census(500);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_THAT(left->lost_ranks(), ::testing::ElementsAre(1));
  EXPECT_EQ(left->lost_nodes_size(), 0);

  peers_.silent.insert("10.0.0.1:7070");
  comm_->Abort(absl::UnavailableError("node1 stopped answering"), /*notify=*/false);
  absl::StatusOr<v1::CommCensusResponse> dead = census(500);
  ASSERT_TRUE(dead.ok()) << dead.status();
  EXPECT_THAT(dead->lost_ranks(), ::testing::ElementsAre(1));
  ASSERT_EQ(dead->lost_nodes_size(), 1);
  EXPECT_THAT(dead->lost_nodes(0), HasSubstr("node1 (10.0.0.1:7070): DEADLINE_EXCEEDED"));
  EXPECT_EQ(dead->failure_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(dead->failure(), "node1 stopped answering");
  EXPECT_EQ(dead->coordinator(), "10.0.0.0:7070");  // node0, the coordinator, survives

  EXPECT_EQ(census(30001).status().code(), absl::StatusCode::kInvalidArgument);

  // An explicit shrink's question: no daemon asked, the excluded ranks lost; excluding node0's
  // only rank (the coordinator's) moves the coordinator to node1.
  peers_.state_asks.clear();
  exclude = {0};
  absl::StatusOr<v1::CommCensusResponse> moved = census(0);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_THAT(moved->lost_ranks(), ::testing::ElementsAre(0));
  EXPECT_EQ(moved->coordinator(), "10.0.0.1:7070");
  EXPECT_TRUE(peers_.state_asks.empty());
  exclude = {2};
  EXPECT_EQ(census(0).status().code(), absl::StatusCode::kInvalidArgument);
  exclude = {-1};
  EXPECT_EQ(census(0).status().code(), absl::StatusCode::kInvalidArgument);
  exclude = {1, 1, 1};  // more than the communicator's 2 ranks
  EXPECT_EQ(census(0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace railyard
