// DigestExchange on its own: "daemons" over the in-process transport exchange the digests of a
// run (the run itself stands in as a completion the test reports), and the collective's outcome
// is the join of both: agreement gives the run's status, a disagreement or an unreadable digest
// gives INVALID_ARGUMENT naming both nodes, before the run's own error, and fails the transfers.
// With N nodes each sends ceil(log2 N) messages at most, and every node learns of a disagreement
// wherever it is.
#include "daemon/comm/digest_exchange.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
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

// An endpoint that counts the messages sent through it.
class CountingEndpoint : public transport::Endpoint {
 public:
  CountingEndpoint(std::shared_ptr<transport::Endpoint> inner, std::atomic<int>* sends)
      : inner_(std::move(inner)), sends_(sends) {}
  void SendV(transport::Tag tag, const transport::Segment* segments, int count,
             transport::CompletionFn done) override {
    sends_->fetch_add(1);
    inner_->SendV(tag, segments, count, std::move(done));
  }
  void RecvV(transport::Tag tag, const transport::Segment* segments, int count,
             transport::RecvCompletionFn done) override {
    inner_->RecvV(tag, segments, count, std::move(done));
  }
  void Abort(const absl::Status& status) override { inner_->Abort(status); }

 private:
  std::shared_ptr<transport::Endpoint> inner_;
  std::atomic<int>* sends_;
};

// N nodes, one rank each, every one running the exchange for one operation.
class Cluster {
 public:
  // Node i is names[i] ("node<i>" without names).
  explicit Cluster(int n, std::vector<std::string> names = {})
      : n_(n),
        layout_(scheduler::CommLayout::Uniform(n, 1, 1)),
        nodes_(n),
        endpoints_(n),
        runs_(n),
        outcome_(n),
        sends_(n) {
    for (int me = 0; me < n; ++me) {
      slots_.push_back(static_cast<uint16_t>(10 + me));
      names_.push_back(me < static_cast<int>(names.size()) ? names[me]
                                                           : "node" + std::to_string(me));
      runs_[me] = std::make_unique<scheduler::NodeRun>();
      outcome_[me] = std::make_unique<Outcome>();
      sends_[me] = std::make_unique<std::atomic<int>>(0);
    }
    for (int me = 0; me < n; ++me) {
      endpoints_[me] = nodes_.EndpointsOf(me);
      for (auto& rails : endpoints_[me]) {
        for (auto& ep : rails) ep = std::make_shared<CountingEndpoint>(ep, sends_[me].get());
      }
    }
    for (int me = 0; me < n; ++me) {
      DigestExchange::Env env;
      env.comm_id = "c";
      env.job = "job";
      env.layout = &layout_;
      env.my_node = me;
      env.endpoints = &endpoints_[me];
      env.node_slots = &slots_;
      env.node_names = &names_;
      env.run = runs_[me].get();
      Outcome* o = outcome_[me].get();
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
      exchange_.push_back(std::make_unique<DigestExchange>(std::move(env)));
    }
  }

  // Runs one operation with node i's digest digests[i] and its run's status runs[i] (OK for
  // those not given). Nodes in `skip` take no part (the test speaks for them).
  void Run(const std::vector<OpDigest>& digests, const std::vector<int>& skip = {},
           const std::vector<absl::Status>& runs = {}) {
    auto skipped = [&](int me) { return std::find(skip.begin(), skip.end(), me) != skip.end(); };
    for (int me = 0; me < n_; ++me) {
      if (skipped(me)) continue;
      exchange_[me]->Prepare(digests[me], schedule_, /*gated=*/false);
      EXPECT_NE(exchange_[me]->carried(), nullptr);
      exchange_[me]->Arm();
      exchange_[me]->RunDone(me < static_cast<int>(runs.size()) ? runs[me] : absl::OkStatus());
    }
    for (int me = 0; me < n_; ++me) {
      if (!skipped(me)) exchange_[me]->Exchange(memory_);
    }
  }

  absl::Status Wait(int me) { return outcome_[me]->Wait(); }
  int sends(int me) const { return sends_[me]->load(); }
  std::vector<absl::Status> aborts(int me) {
    absl::MutexLock lock(&outcome_[me]->mu);
    return outcome_[me]->aborts;
  }
  transport::Endpoint& endpoint(int from, int to) { return *endpoints_[from][to][0]; }
  transport::Tag TagTo(int dst, int src, uint64_t seq) const {
    return scheduler::tags::CollectiveTag(slots_[dst], src, seq, scheduler::tags::kDigestStep);
  }

 private:
  const int n_;
  const scheduler::CommLayout layout_;
  std::vector<uint16_t> slots_;
  std::vector<std::string> names_;
  std::shared_ptr<const scheduler::NodeSchedule> schedule_ =
      std::make_shared<scheduler::NodeSchedule>();
  scheduler::RankMemory memory_;
  testing::InProcNodes nodes_;
  std::vector<scheduler::EndpointTable> endpoints_;
  std::vector<std::unique_ptr<scheduler::NodeRun>> runs_;
  std::vector<std::unique_ptr<Outcome>> outcome_;
  std::vector<std::unique_ptr<std::atomic<int>>> sends_;
  std::vector<std::unique_ptr<DigestExchange>> exchange_;
};

OpDigest Count(uint64_t count) {
  scheduler::RankRequest r;
  r.op = scheduler::OpKind::kAllReduce;
  r.dtype = kernels::DataType::kFloat32;
  r.count = count;
  return OpDigest::Of(r, 7, "ring");
}

int CeilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

TEST(DigestExchangeTest, AgreeingNodesCompleteWithTheRunsStatus) {
  Cluster c(2, {"alpha", "beta"});
  c.Run({Count(1024), Count(1024)}, {}, {absl::OkStatus(), absl::DataLossError("crc")});
  EXPECT_TRUE(c.Wait(0).ok());
  EXPECT_EQ(c.Wait(1), absl::DataLossError("crc"));
  EXPECT_TRUE(c.aborts(0).empty());
}

TEST(DigestExchangeTest, ADisagreementNamesBothNodesBeforeTheRunsErrorAndFailsTransfers) {
  Cluster c(2, {"alpha", "beta"});
  c.Run({Count(1024), Count(2048)}, {}, {absl::OkStatus(), absl::UnavailableError("peer gone")});
  for (int me = 0; me < 2; ++me) {
    const absl::Status s = c.Wait(me);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("alpha"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("beta"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("count"));
    const std::vector<absl::Status> aborts = c.aborts(me);
    ASSERT_EQ(aborts.size(), 1u);
    EXPECT_EQ(aborts[0], s);
  }
}

TEST(DigestExchangeTest, AShortDigestFromAPeerIsRefusedAsUnreadable) {
  // Node 0 runs the exchange; "node 1" is a hostile peer that sends 10 bytes with the digest tag.
  Cluster c(2, {"alpha", "beta"});
  c.Run({Count(64), Count(64)}, /*skip=*/{1});
  std::vector<std::byte> junk(10, std::byte{0x5a});
  c.endpoint(1, 0).Send(c.TagTo(0, 1, 7), junk.data(), junk.size(), [](absl::Status) {});
  // And drains node 0's digest so that its send completes.
  std::vector<std::byte> sink(DigestSummary::kMaxBytes + OpDigest::kMaxCarriedBytes);
  const transport::Segment in{sink.data(), sink.size()};
  c.endpoint(1, 0).RecvV(c.TagTo(1, 0, 7), &in, 1, [](absl::Status, size_t) {});
  const absl::Status s = c.Wait(0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("seq 7: beta sent a 10-byte operation digest"));
}

TEST(DigestExchangeTest, PayloadFromAnAgreeingPeerWhereNoneIsExpectedIsRefused) {
  // "beta" submitted the same operation but sends 8 bytes with its digest that alpha's schedule
  // has no receive for (from a peer that disagrees, such bytes are its other size's: the
  // disagreement names both sides instead, TwoDaemonsTest.NodesThatDisagreeOnASmallCount...).
  Cluster c(2, {"alpha", "beta"});
  c.Run({Count(64), Count(64)}, /*skip=*/{1});
  DigestSummary::Wire w;
  const size_t len = DigestSummary::Of(1, Count(64)).Encode(&w);
  std::vector<std::byte> msg(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(len));
  msg.resize(len + 8, std::byte{0x11});
  c.endpoint(1, 0).Send(c.TagTo(0, 1, 7), msg.data(), msg.size(), [](absl::Status) {});
  std::vector<std::byte> sink(DigestSummary::kMaxBytes + OpDigest::kMaxCarriedBytes);
  const transport::Segment in{sink.data(), sink.size()};
  c.endpoint(1, 0).RecvV(c.TagTo(1, 0, 7), &in, 1, [](absl::Status, size_t) {});
  const absl::Status s = c.Wait(0);
  EXPECT_EQ(s,
            absl::InvalidArgumentError(
                "seq 7: beta sent 8 bytes with its operation digest, where alpha receives none"));
}

TEST(DigestExchangeTest, WithNoPeerTheRunAloneCompletesTheCollective) {
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

TEST(DigestExchangeShapeTest, EachNodeSendsAtMostCeilLog2NMessages) {
  EXPECT_EQ(DigestExchange::MessagesPerOperation(1, 0), 0);
  EXPECT_EQ(DigestExchange::MessagesPerOperation(2, 0), 1);
  EXPECT_EQ(DigestExchange::MessagesPerOperation(8, 5), 3);
  EXPECT_EQ(DigestExchange::MessagesPerOperation(16, 0), 4);
  // 5 nodes: node 4 folds into node 0, which then takes two rounds and answers it.
  EXPECT_EQ(DigestExchange::MessagesPerOperation(5, 0), 3);
  EXPECT_EQ(DigestExchange::MessagesPerOperation(5, 1), 2);
  EXPECT_EQ(DigestExchange::MessagesPerOperation(5, 4), 1);
  for (int n = 2; n <= 300; ++n) {
    int total = 0;
    for (int me = 0; me < n; ++me) {
      const int m = DigestExchange::MessagesPerOperation(n, me);
      EXPECT_LE(m, CeilLog2(n)) << n << " nodes, node " << me;
      EXPECT_GE(m, 1) << n << " nodes, node " << me;
      total += m;
    }
    EXPECT_LT(total, n * CeilLog2(n) + 1) << n;
  }
}

class DigestExchangeNodesTest : public ::testing::TestWithParam<int> {};

TEST_P(DigestExchangeNodesTest, AgreeingNodesCompleteOkSendingLogNMessagesEach) {
  const int n = GetParam();
  Cluster c(n);
  c.Run(std::vector<OpDigest>(n, Count(1024)));
  for (int me = 0; me < n; ++me) {
    EXPECT_TRUE(c.Wait(me).ok()) << "node " << me << ": " << c.Wait(me);
    EXPECT_EQ(c.sends(me), DigestExchange::MessagesPerOperation(n, me)) << "node " << me;
    EXPECT_LE(c.sends(me), CeilLog2(n));
    EXPECT_TRUE(c.aborts(me).empty());
  }
}

TEST_P(DigestExchangeNodesTest, EveryNodeLearnsOfOneDisagreeingNodeWhereverItIs) {
  const int n = GetParam();
  for (int odd = 0; odd < n; ++odd) {
    Cluster c(n);
    std::vector<OpDigest> digests(n, Count(1024));
    digests[odd] = Count(2048);
    c.Run(digests);
    const std::string odd_side = "node" + std::to_string(odd) + " ranks " + std::to_string(odd) +
                                 " submitted allreduce float count=2048";
    for (int me = 0; me < n; ++me) {
      const absl::Status s = c.Wait(me);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "odd " << odd << ", node " << me;
      EXPECT_THAT(std::string(s.message()), HasSubstr("nodes disagree at seq 7 on count: "));
      EXPECT_THAT(std::string(s.message()), HasSubstr(odd_side)) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("count=1024")) << s;
      // Its transfers failed once, with the same words.
      const std::vector<absl::Status> aborts = c.aborts(me);
      ASSERT_EQ(aborts.size(), 1u) << "odd " << odd << ", node " << me;
      EXPECT_EQ(aborts[0], s);
    }
  }
}

TEST_P(DigestExchangeNodesTest, TwoCampsAreNamedAlikeOnEveryNode) {
  // Half the nodes submit one count, half another: every node names the same pair of nodes.
  const int n = GetParam();
  Cluster c(n);
  std::vector<OpDigest> digests;
  for (int me = 0; me < n; ++me) digests.push_back(Count(me % 2 == 0 ? 1024 : 4096));
  c.Run(digests);
  std::vector<std::string> pairs;
  for (int me = 0; me < n; ++me) {
    const absl::Status s = c.Wait(me);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    std::string named;
    for (int k = 0; k < n; ++k) {
      if (s.message().find("node" + std::to_string(k) + " ranks") != absl::string_view::npos) {
        named += std::to_string(k) + ",";
      }
    }
    pairs.push_back(named);
  }
  for (int me = 1; me < n; ++me) EXPECT_EQ(pairs[me], pairs[0]) << "node " << me;
}

INSTANTIATE_TEST_SUITE_P(Nodes, DigestExchangeNodesTest,
                         ::testing::Values(2, 3, 4, 5, 6, 7, 8, 9, 12, 16));

TEST(DigestExchangeHostileTest, ASummaryNamingANodeOutsideItsSendersGroupIsRefused) {
  // Four nodes; node 1 is hostile: in round 0 it tells node 0 that node 2 (which it has not
  // heard from) agrees. Node 0 refuses it, and node 2 learns so in round 1.
  Cluster c(4);
  c.Run(std::vector<OpDigest>(4, Count(1024)), /*skip=*/{1});
  DigestSummary::Wire forged;
  const size_t len = DigestSummary::Of(2, Count(1024)).Encode(&forged);
  c.endpoint(1, 0).Send(c.TagTo(0, 1, 7), forged.data(), len, [](absl::Status) {});
  // Node 1's round-1 message to node 3, as an honest node 1 would send it.
  DigestSummary::Wire honest;
  const size_t hlen = DigestSummary::Of(0, Count(1024)).Encode(&honest);
  c.endpoint(1, 3).Send(c.TagTo(3, 1, 7), honest.data(), hlen, [](absl::Status) {});
  // And drains what nodes 0 and 3 send it.
  std::vector<std::byte> sink[2];
  for (int i = 0; i < 2; ++i) {
    const int from = i == 0 ? 0 : 3;
    sink[i].resize(DigestSummary::kMaxBytes + OpDigest::kMaxCarriedBytes);
    const transport::Segment in{sink[i].data(), sink[i].size()};
    c.endpoint(1, from).RecvV(c.TagTo(1, from, 7), &in, 1, [](absl::Status, size_t) {});
  }
  for (int me : {0, 2}) {
    const absl::Status s = c.Wait(me);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("node1 sent " + std::string(me == 0 ? "" : "node0 ") +
                          "an operation digest naming a node it has not heard from"))
        << "node " << me;
  }
  // Node 3 heard only from node 2 and the lying node 1: it cannot know.
  EXPECT_TRUE(c.Wait(3).ok());
}

}  // namespace
}  // namespace railyard
