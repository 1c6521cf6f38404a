// Comm::Shrink and Comm::Grow across two daemons (issue 58's explicit shrink and grow, as
// ncclCommShrink and ncclCommGrow): survivors renumbered without an id handed around, new ranks
// joining with the id an existing rank obtains, every result exact.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/derived_comm_id.h"
#include "railyard/client.h"
#include "tests/integration/virtual_cluster.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;
using testing::PeerPlane;
using testing::VirtualCluster;

// Every rank's AllReduce of (rank + 1) over comm, in threads; the sums each saw.
std::vector<float> SumOfRanks(std::vector<std::unique_ptr<Client>>& clients,
                              std::vector<Comm*> comms) {
  std::vector<float> got(comms.size(), -1);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < comms.size(); ++i) {
    threads.emplace_back([&, i] {
      auto buf = clients[i]->Allocate(64);
      if (!buf.ok()) return;
      float* v = buf->span<float>().data();
      for (int k = 0; k < 16; ++k) v[k] = static_cast<float>(comms[i]->rank() + 1);
      absl::Status s = comms[i]
                           ->AllReduce(*buf, *buf, 16, DataType::kFloat32, RedOp::kSum)
                           .wait(std::chrono::seconds(60));
      if (s.ok() && v[15] == v[0]) got[i] = v[0];
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

TEST(ShrinkGrowTest, DerivedIdsMatchThePythonClients) {
  // The same pair as tests/python/test_shrink_grow.py checks in Python.
  EXPECT_EQ(
      internal::DerivedCommId("ry1-0123456789abcdef0123456789abcdef@10.0.0.1:7070", "shrink/1/3"),
      "ry1-3fd3c6c74204b9cc3950258877052ad2@10.0.0.1:7070");
}

TEST(ShrinkGrowTest, SurvivorsShrinkWithoutAnIdAndNewRanksGrowItBack) {
  VirtualCluster cluster(2, {}, PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  // Ranks 0, 1 on vnode0; 2, 3 on vnode1; a fifth client on vnode1 joins at the grow.
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 5; ++i) {
    auto c = Client::Connect(cluster[i < 2 ? 0 : 1].Options());
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  auto id = clients[0]->CreateCommId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<Comm> world(4);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] {
        auto c = clients[r]->InitComm(*id, r, 4);
        if (c.ok()) world[r] = *std::move(c);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < 4; ++r) ASSERT_EQ(world[r].nranks(), 4) << r;
  EXPECT_EQ(SumOfRanks(clients, {&world[0], &world[1], &world[2], &world[3]}),
            std::vector<float>(4, 10.0f));

  // Bad arguments, refused before anything is joined.
  EXPECT_EQ(world[0].Shrink({4}).status().code(), absl::StatusCode::kInvalidArgument);
  auto own = world[1].Shrink({1});
  EXPECT_THAT(std::string(own.status().message()), HasSubstr("in its own exclude list"));
  EXPECT_EQ(world[0].Grow(4).status().code(), absl::StatusCode::kInvalidArgument);

  // Rank 1 (vnode0) is dropped: 0, 2, 3 become 0, 1, 2 of 3.
  std::vector<Comm> small(3);
  {
    const int survivors[3] = {0, 2, 3};
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) {
      threads.emplace_back([&, i] {
        auto c = world[survivors[i]].Shrink({1});
        if (c.ok()) small[i] = *std::move(c);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(small[i].nranks(), 3) << i;
    EXPECT_EQ(small[i].rank(), i);
  }
  std::vector<std::unique_ptr<Client>> sc;  // the survivors' clients, in their new rank order
  for (int r : {0, 2, 3}) sc.push_back(std::move(clients[r]));
  EXPECT_EQ(SumOfRanks(sc, {&small[0], &small[1], &small[2]}), std::vector<float>(3, 6.0f));

  // Grown to 4 with the fifth client as rank 3, joining with the id rank 0 hands it.
  auto grow_id = small[0].GrowId(4);
  ASSERT_TRUE(grow_id.ok()) << grow_id.status();
  EXPECT_EQ(*small[2].GrowId(4), *grow_id);  // every rank derives the same
  std::vector<Comm> big(4);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) {
      threads.emplace_back([&, i] {
        auto c = small[i].Grow(4);
        if (c.ok()) big[i] = *std::move(c);
      });
    }
    threads.emplace_back([&] {
      auto c = clients[4]->InitComm(*grow_id, 3, 4);
      if (c.ok()) big[3] = *std::move(c);
    });
    for (auto& t : threads) t.join();
  }
  for (int i = 0; i < 4; ++i) ASSERT_EQ(big[i].nranks(), 4) << i;
  sc.push_back(std::move(clients[4]));
  EXPECT_EQ(SumOfRanks(sc, {&big[0], &big[1], &big[2], &big[3]}), std::vector<float>(4, 10.0f));
  for (auto* set : {&big, &small}) {
    for (Comm& c : *set) EXPECT_TRUE(c.Destroy().ok());
  }
  for (Comm& c : world) c.Destroy().IgnoreError();
}

// A node dies (SIGKILL of its daemon, the communicator's coordinator): the survivors' next
// AllReduce fails, LostRanks names the rank and node, and ShrinkLost joins the survivors'
// communicator, coordinated by the lowest survivor's node now.
TEST(ShrinkGrowTest, SurvivorsOfADeadCoordinatorNodeShrinkByTheDaemonsCensus) {
  // The dead node's client must not wait for a new daemon there.
  setenv("RAILYARD_RECONNECT_S", "0", 1);
  VirtualCluster cluster(3, {"--peer_timeout=2s"}, PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 3; ++i) {
    auto c = Client::Connect(cluster[i].Options());
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  auto id = clients[0]->CreateCommId();  // vnode0 coordinates
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<Comm> world(3);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        auto c = clients[r]->InitComm(*id, r, 3);
        if (c.ok()) world[r] = *std::move(c);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < 3; ++r) ASSERT_EQ(world[r].nranks(), 3) << r;
  EXPECT_EQ(SumOfRanks(clients, {&world[0], &world[1], &world[2]}), std::vector<float>(3, 6.0f));

  // Healthy: nothing is lost, and nothing to shrink; bad timeouts are refused.
  auto none = world[1].LostRanks();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->ranks.empty());
  EXPECT_TRUE(none->failure.ok());
  EXPECT_EQ(none->coordinator, id->substr(id->find('@') + 1));
  EXPECT_EQ(world[1].ShrinkLost().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(world[1].LostRanks(std::chrono::milliseconds(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(world[1].LostRanks(std::chrono::milliseconds(30001)).status().code(),
            absl::StatusCode::kInvalidArgument);

  cluster[0].Kill();
  std::vector<std::unique_ptr<Client>> sc;  // the survivors' clients
  for (int r : {1, 2}) sc.push_back(std::move(clients[r]));
  // Their AllReduce on the old communicator fails (a transfer to the dead node, or its silence).
  EXPECT_EQ(SumOfRanks(sc, {&world[1], &world[2]}), std::vector<float>(2, -1.0f));

  std::vector<Comm> small(2);
  std::vector<Comm::Lost> lost(2);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        auto l = world[i + 1].LostRanks();
        if (l.ok()) lost[i] = *l;
        auto c = world[i + 1].ShrinkLost(std::chrono::seconds(30));
        if (c.ok()) small[i] = *std::move(c);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(lost[i].ranks, std::vector<int>{0}) << i;
    ASSERT_EQ(lost[i].nodes.size(), 1u) << i;
    EXPECT_THAT(lost[i].nodes[0], HasSubstr("vnode0"));
    EXPECT_FALSE(lost[i].failure.ok());
    // vnode0 coordinated: the survivors' communicator names vnode1 (rank 1's node) instead.
    EXPECT_NE(lost[i].coordinator, id->substr(id->find('@') + 1));
    ASSERT_EQ(small[i].nranks(), 2) << i;
    EXPECT_EQ(small[i].rank(), i);
  }
  // An explicit Shrink({0}) names the same coordinator (its id is the one ShrinkLost joined).
  auto explicit_coordinator = world[1].ShrinkCoordinator({0});
  ASSERT_TRUE(explicit_coordinator.ok()) << explicit_coordinator.status();
  EXPECT_EQ(*explicit_coordinator, lost[0].coordinator);
  EXPECT_EQ(world[1].ShrinkCoordinator({7}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SumOfRanks(sc, {&small[0], &small[1]}), std::vector<float>(2, 3.0f));
  for (Comm& c : small) EXPECT_TRUE(c.Destroy().ok());
  for (int r : {1, 2}) world[r].Destroy().IgnoreError();
  world[0] = Comm();  // its daemon is gone
  unsetenv("RAILYARD_RECONNECT_S");
}

}  // namespace
}  // namespace railyard
