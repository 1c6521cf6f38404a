// DaemonCommFactory on its own: two "daemons" in one process over the in-process transport (two
// rails each), each building its side of a multi-node communicator from the same coordinator
// layout. The communicators it makes move data across, every link goes through the link stack
// (the test's wire layer sees each one), and a layout it cannot use is refused with what and why.
#include "daemon/core/comm_factory.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "daemon/comm/pending_request.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/tags.h"
#include "daemon/transport/inproc/inproc_transport.h"
#include "daemon/util/deadline_timer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fakes.h"

namespace railyard {
namespace {

using scheduler::OpKind;
using ::testing::HasSubstr;
using testing::RecordingSink;

constexpr int kRails = 2;

// Counts the wire endpoints it wraps, by rail (what railyardd-testing's bit flips hook into).
struct WireCounter {
  std::atomic<int> by_rail[kRails] = {};
  transport::LinkStack::WireLayer Layer() {
    return [this](std::shared_ptr<transport::Endpoint> wire, int rail) {
      if (rail >= 0 && rail < kRails) ++by_rail[rail];
      return wire;
    };
  }
};

std::unique_ptr<PendingRequest> AllReduce(uint64_t id, int rank, std::vector<float>& data,
                                          const std::shared_ptr<RecordingSink>& sink) {
  auto p = std::make_unique<PendingRequest>();
  p->request_id = id;
  p->rank = rank;
  p->session = sink;
  p->req.op = OpKind::kAllReduce;
  p->req.dtype = kernels::DataType::kFloat32;
  p->req.red_op = kernels::RedOp::kSum;
  p->req.count = data.size();
  p->req.send = reinterpret_cast<std::byte*>(data.data());
  p->req.recv = reinterpret_cast<std::byte*>(data.data());
  return p;
}

class CommFactoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fabric_ = transport::InProcFabric::Create();
    for (int n = 0; n < 2; ++n) {
      configs_[n].node_name = "node" + std::to_string(n);
      configs_[n].chunk_bytes = 64 * 1024;
      auto t = fabric_->NewTransport(configs_[n].node_name, kRails);
      ASSERT_TRUE(t.ok()) << t.status();
      transports_[n] = *std::move(t);
      factories_[n] = std::make_unique<DaemonCommFactory>(
          configs_[n], DaemonCommFactory::Deps{&executor_, &timer_, nullptr, nullptr},
          transport::LinkStack(wires_[n].Layer()));
      factories_[n]->SetFabric(transports_[n].get(), {"railA", "railB"}, {nullptr, nullptr});
      auto slot = slots_[n].Acquire();
      ASSERT_TRUE(slot.ok());
      held_[n] = *slot;
    }
  }

  // The coordinator's layout: node n has ranks n (one rank per node), both rails.
  v1::JoinCommResponse Layout() {
    v1::JoinCommResponse layout;
    for (int n = 0; n < 2; ++n) {
      v1::NodeInfo* node = layout.add_nodes();
      node->set_node_name(configs_[n].node_name);
      node->set_peer_address("10.0.0." + std::to_string(n) + ":7070");
      node->set_tag_slot(held_[n]->value());
      for (int r = 0; r < kRails; ++r) node->add_rail_addresses(*transports_[n]->LocalAddress(r));
      layout.add_node_of_rank(n);
    }
    layout.set_rails(kRails);
    layout.set_data_secret(0x5eed);
    layout.set_integrity("crc32c");
    return layout;
  }

  static void Join(Communicator& comm, int rank) {
    ASSERT_TRUE(
        comm.Join(rank, absl::Seconds(10), [](const absl::Status& s) { EXPECT_TRUE(s.ok()) << s; })
            .ok());
  }

  testing::FakeClock clock_;
  DeadlineTimer timer_{&clock_};
  scheduler::Executor executor_{2};
  DaemonConfig configs_[2];
  std::shared_ptr<transport::InProcFabric> fabric_;
  std::unique_ptr<transport::InProcTransport> transports_[2];
  WireCounter wires_[2];
  std::unique_ptr<DaemonCommFactory> factories_[2];
  scheduler::tags::TagSlotTable slots_[2];
  std::shared_ptr<const scheduler::tags::Slot> held_[2];
  std::shared_ptr<RecordingSink> sink_ = std::make_shared<RecordingSink>();
};

TEST_F(CommFactoryTest, BothSidesOfALayoutReduceAcrossNodesThroughEveryRailsLinkStack) {
  std::shared_ptr<Communicator> comm[2];
  for (int n = 0; n < 2; ++n) {
    auto made = factories_[n]->MakeMultiNode("job", "ry1-x", Layout(), n, held_[n], "");
    ASSERT_TRUE(made.ok()) << made.status();
    comm[n] = *made;
    EXPECT_TRUE(comm[n]->multi_node());
    EXPECT_EQ(comm[n]->nranks(), 2);
    Join(*comm[n], n);
    // One link to the other node per rail, each through the wire layer once.
    EXPECT_EQ(wires_[n].by_rail[0].load(), 1);
    EXPECT_EQ(wires_[n].by_rail[1].load(), 1);
  }
  std::vector<float> data[2] = {std::vector<float>(50000, 1.5f), std::vector<float>(50000, 2.0f)};
  for (int n = 0; n < 2; ++n)
    ASSERT_TRUE(comm[n]->Submit(AllReduce(1 + n, n, data[n], sink_)).ok());
  for (int n = 0; n < 2; ++n) {
    const testing::Completion c = sink_->Wait(1 + n);
    ASSERT_TRUE(c.status.ok()) << c.status;
    for (float v : data[n]) ASSERT_EQ(v, 3.5f);
  }
  for (int n = 0; n < 2; ++n) comm[n]->Abort(absl::CancelledError("test over"));
}

TEST_F(CommFactoryTest, ALocalCommunicatorRunsItsRanksOnThisNode) {
  std::shared_ptr<Communicator> comm = factories_[0]->MakeLocal("job", "ry1-l", 2, v1::CostModel());
  EXPECT_FALSE(comm->multi_node());
  Join(*comm, 0);
  Join(*comm, 1);
  std::vector<float> a(100, 1.0f), b(100, 4.0f);
  ASSERT_TRUE(comm->Submit(AllReduce(10, 0, a, sink_)).ok());
  ASSERT_TRUE(comm->Submit(AllReduce(11, 1, b, sink_)).ok());
  ASSERT_TRUE(sink_->Wait(10).status.ok());
  ASSERT_TRUE(sink_->Wait(11).status.ok());
  EXPECT_EQ(a[99], 5.0f);
  EXPECT_EQ(b[0], 5.0f);
  comm->Abort(absl::CancelledError("test over"));
}

TEST_F(CommFactoryTest, ALayoutThisNodeCannotUseIsRefusedSayingWhy) {
  // A slot of this daemon's other than the one the layout carries for it.
  absl::StatusOr<std::shared_ptr<const scheduler::tags::Slot>> other = slots_[0].Acquire();
  ASSERT_TRUE(other.ok());
  ASSERT_NE((*other)->value(), held_[0]->value());
  auto wrong_slot = factories_[0]->MakeMultiNode("job", "ry1-a", Layout(), 0, *other, "");
  EXPECT_EQ(wrong_slot.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_slot.status().message(), HasSubstr("tag_slot"));

  v1::JoinCommResponse bad = Layout();
  bad.set_integrity("md5");
  auto bad_integrity = factories_[0]->MakeMultiNode("job", "ry1-b", bad, 0, held_[0], "");
  EXPECT_EQ(bad_integrity.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(bad_integrity.status().message(), HasSubstr("ry1-b"));

  auto bad_ask = factories_[0]->MakeMultiNode("job", "ry1-c", Layout(), 0, held_[0], "sha1");
  EXPECT_EQ(bad_ask.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_ask.status().message(), HasSubstr("integrity"));

  v1::JoinCommResponse one_rail = Layout();
  one_rail.mutable_nodes(1)->mutable_rail_addresses()->RemoveLast();
  auto missing = factories_[0]->MakeMultiNode("job", "ry1-d", one_rail, 0, held_[0], "");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr("node1 has no address for rail 1"));
  // The slot and integrity checks refuse before any link is made; the missing address is found
  // while linking, after rail 0 to node1 was made.
  EXPECT_EQ(wires_[0].by_rail[0].load() + wires_[0].by_rail[1].load(), 1)
      << "links made by refused layouts";
}

TEST_F(CommFactoryTest, WithoutATransportOnlyLocalCommunicatorsAreMade) {
  DaemonConfig config;
  config.node_name = "alone";
  DaemonCommFactory alone(config, {&executor_, &timer_, nullptr, nullptr}, transport::LinkStack());
  auto made = alone.MakeMultiNode("job", "ry1-z", Layout(), 0, held_[0], "");
  EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(made.status().message(), HasSubstr("no transport"));
  EXPECT_NE(alone.MakeLocal("job", "ry1-y", 1, v1::CostModel()), nullptr);
}

}  // namespace
}  // namespace railyard
