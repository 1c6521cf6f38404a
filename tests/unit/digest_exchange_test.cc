// DigestExchange on its own: two "daemons" over the in-process transport exchange the digests of
// a run (the run itself stands in as a completion the test reports), and the collective's outcome
// is the join of both: agreement gives the run's status, a disagreement or an unreadable digest
// gives INVALID_ARGUMENT naming both nodes, before the run's own error, and fails the transfers.
#include "daemon/comm/digest_exchange.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/scheduler/tags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/inproc_nodes.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

// What a side's communicator would see: the outcome, and the transfers it was told to fail.
struct Outcome {
  absl::Mutex mu;
  bool done = false;
  absl::Status status;
  std::vector<absl::Status> aborts;
  absl::Status Wait() {
    absl::MutexLock lock(&mu);
    const bool arrived = mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(20));
    EXPECT_TRUE(arrived);
    return status;
  }
};

class DigestExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int me = 0; me < 2; ++me) endpoints_[me] = nodes_.EndpointsOf(me);
    for (int me = 0; me < 2; ++me) {
      DigestExchange::Env env;
      env.comm_id = "c1";
      env.job = "job";
      env.layout = &layout_;
      env.my_node = me;
      env.endpoints = &endpoints_[me];
      env.node_slots = &slots_;
      env.node_names = &names_;
      env.run = &runs_[me];
      Outcome* o = &outcome_[me];
      env.abort_transfers = [o](const absl::Status& s) {
        absl::MutexLock lock(&o->mu);
        o->aborts.push_back(s);
      };
      env.done = [o](const absl::Status& s) {
        absl::MutexLock lock(&o->mu);
        EXPECT_FALSE(o->done) << "done twice";
        o->done = true;
        o->status = s;
      };
      exchange_[me] = std::make_unique<DigestExchange>(std::move(env));
    }
  }

  static OpDigest Digest(uint64_t count, uint64_t seq = 7) {
    scheduler::RankRequest r;
    r.op = scheduler::OpKind::kAllReduce;
    r.dtype = kernels::DataType::kFloat32;
    r.count = count;
    return OpDigest::Of(r, seq, "ring");
  }

  // Runs one operation: each node's digest, then the run's own status on each node.
  void Run(const OpDigest (&mine)[2], const absl::Status (&run)[2]) {
    for (int me = 0; me < 2; ++me) {
      exchange_[me]->Prepare(mine[me], schedule_, /*gated=*/false);
      EXPECT_NE(exchange_[me]->carried(), nullptr);
      exchange_[me]->Arm();
      exchange_[me]->RunDone(run[me]);
    }
    for (int me = 0; me < 2; ++me) exchange_[me]->Exchange(memory_);
  }

  const scheduler::CommLayout layout_ = scheduler::CommLayout::Uniform(2, 1, 1);
  const std::vector<uint16_t> slots_{3, 4};
  const std::vector<std::string> names_{"alpha", "beta"};
  std::shared_ptr<const scheduler::NodeSchedule> schedule_ =
      std::make_shared<scheduler::NodeSchedule>();
  scheduler::RankMemory memory_;
  testing::InProcNodes nodes_;
  scheduler::EndpointTable endpoints_[2];
  scheduler::NodeRun runs_[2];
  Outcome outcome_[2];
  std::unique_ptr<DigestExchange> exchange_[2];
};

TEST_F(DigestExchangeTest, AgreeingNodesCompleteWithTheRunsStatus) {
  Run({Digest(1024), Digest(1024)}, {absl::OkStatus(), absl::DataLossError("crc")});
  EXPECT_TRUE(outcome_[0].Wait().ok());
  EXPECT_EQ(outcome_[1].Wait(), absl::DataLossError("crc"));
  EXPECT_TRUE(outcome_[0].aborts.empty());
}

TEST_F(DigestExchangeTest, ADisagreementNamesBothNodesBeforeTheRunsErrorAndFailsTransfers) {
  Run({Digest(1024), Digest(2048)}, {absl::OkStatus(), absl::UnavailableError("peer gone")});
  for (int me = 0; me < 2; ++me) {
    const absl::Status s = outcome_[me].Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("alpha"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("beta"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("count"));
    absl::MutexLock lock(&outcome_[me].mu);
    ASSERT_EQ(outcome_[me].aborts.size(), 1u);
    EXPECT_EQ(outcome_[me].aborts[0], s);
  }
}

TEST_F(DigestExchangeTest, AShortDigestFromAPeerIsRefusedAsUnreadable) {
  // Node 0 runs the exchange; "node 1" is a hostile peer that sends 10 bytes with the digest tag.
  exchange_[0]->Prepare(Digest(64), schedule_, false);
  exchange_[0]->Arm();
  exchange_[0]->RunDone(absl::OkStatus());
  exchange_[0]->Exchange(memory_);
  std::vector<std::byte> junk(10, std::byte{0x5a});
  const transport::Tag tag =
      scheduler::tags::CollectiveTag(slots_[0], 1, 7, scheduler::tags::kDigestStep);
  endpoints_[1][0][0]->Send(tag, junk.data(), junk.size(), [](absl::Status) {});
  // And drains node 0's digest so that its send completes.
  std::vector<std::byte> sink(OpDigest::kBytes + OpDigest::kMaxCarriedBytes);
  endpoints_[1][0][0]->Recv(
      scheduler::tags::CollectiveTag(slots_[1], 0, 7, scheduler::tags::kDigestStep), sink.data(),
      sink.size(), [](absl::Status) {});
  const absl::Status s = outcome_[0].Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("seq 7: beta sent a 10-byte operation digest"));
}

TEST_F(DigestExchangeTest, WithNoPeerTheRunAloneCompletesTheCollective) {
  const scheduler::CommLayout one = scheduler::CommLayout::Uniform(1, 2, 1);
  Outcome outcome;
  DigestExchange::Env env;
  env.layout = &one;
  env.done = [&](const absl::Status& s) {
    absl::MutexLock lock(&outcome.mu);
    outcome.done = true;
    outcome.status = s;
  };
  DigestExchange alone(std::move(env));
  EXPECT_EQ(alone.carried(), nullptr);
  alone.Arm();
  alone.RunDone(absl::AbortedError("x"));
  EXPECT_EQ(outcome.Wait(), absl::AbortedError("x"));
}

}  // namespace
}  // namespace railyard
