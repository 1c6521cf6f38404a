// Local.CommCensus's answer from hand-made member views (daemon/diagnose/census.h): which ranks
// are gone, which nodes did not answer, who coordinates the shrunk communicator, and that a view
// cannot speak for another node's ranks.
#include "daemon/diagnose/census.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard::diagnose {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// 3 nodes, 2 ranks each (2n, 2n+1); the comm id names node 0 as coordinator.
CensusLayout Layout() {
  CensusLayout l;
  l.nranks = 6;
  l.node_of_rank = {0, 0, 1, 1, 2, 2};
  l.node_names = {"n0", "n1", "n2"};
  l.node_addresses = {"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"};
  l.coordinator = "10.0.0.1:7000";
  return l;
}

v1::CommState View(int node, bool left0 = false, bool left1 = false) {
  v1::CommState st;
  st.set_node_index(node);
  v1::RankProgress* a = st.add_ranks();
  a->set_rank(2 * node);
  a->set_left(left0);
  v1::RankProgress* b = st.add_ranks();
  b->set_rank(2 * node + 1);
  b->set_left(left1);
  return st;
}

TEST(CensusTest, EveryNodeAnsweringWithEveryRankLosesNothing) {
  const Census c = TakeCensus(Layout(), {View(0), View(1), View(2)}, {});
  EXPECT_THAT(c.lost_ranks, IsEmpty());
  EXPECT_THAT(c.lost_nodes, IsEmpty());
  EXPECT_EQ(c.coordinator, "10.0.0.1:7000");
}

TEST(CensusTest, ASilentNodeLosesAllItsRanksAndIsNamedWithWhy) {
  const Census c =
      TakeCensus(Layout(), {View(0), View(2)}, {{1, "n1", "DEADLINE_EXCEEDED after 2 s"}});
  EXPECT_THAT(c.lost_ranks, ElementsAre(2, 3));
  ASSERT_EQ(c.lost_nodes.size(), 1u);
  EXPECT_THAT(c.lost_nodes[0], HasSubstr("n1 (10.0.0.2:7000): DEADLINE_EXCEEDED after 2 s"));
  EXPECT_EQ(c.coordinator, "10.0.0.1:7000");  // node 0 survives: it still coordinates
}

TEST(CensusTest, ANodeWithNoViewAndNoReasonIsLostToo) {
  const Census c = TakeCensus(Layout(), {View(0), View(1)}, {});
  EXPECT_THAT(c.lost_ranks, ElementsAre(4, 5));
  ASSERT_EQ(c.lost_nodes.size(), 1u);
  EXPECT_THAT(c.lost_nodes[0], HasSubstr("n2"));
}

TEST(CensusTest, ARankThatLeftIsLostOnANodeThatAnswered) {
  const Census c = TakeCensus(Layout(), {View(0), View(1, false, true), View(2)}, {});
  EXPECT_THAT(c.lost_ranks, ElementsAre(3));
  EXPECT_THAT(c.lost_nodes, IsEmpty());
}

TEST(CensusTest, TheCoordinatorsNodeLostMovesCoordinationToTheLowestSurvivor) {
  const Census c =
      TakeCensus(Layout(), {View(1, true, false), View(2)}, {{0, "n0", "UNAVAILABLE"}});
  EXPECT_THAT(c.lost_ranks, ElementsAre(0, 1, 2));
  EXPECT_EQ(c.coordinator, "10.0.0.2:7000");  // rank 3, on n1, is the lowest survivor
}

TEST(CensusTest, ACoordinatorWhoseRanksAllLeftIsReplacedEvenThoughItAnswered) {
  const Census c = TakeCensus(Layout(), {View(0, true, true), View(1), View(2)}, {});
  EXPECT_THAT(c.lost_ranks, ElementsAre(0, 1));
  EXPECT_EQ(c.coordinator, "10.0.0.2:7000");
}

TEST(CensusTest, AViewCannotVouchForAnotherNodesRanks) {
  // Node 2's view lists node 1's ranks as present; node 1 did not answer.
  v1::CommState liar = View(2);
  liar.add_ranks()->set_rank(2);
  liar.add_ranks()->set_rank(3);
  liar.add_ranks()->set_rank(99);  // and one out of range
  liar.add_ranks()->set_rank(-1);
  const Census c = TakeCensus(Layout(), {View(0), liar}, {{1, "n1", "UNAVAILABLE"}});
  EXPECT_THAT(c.lost_ranks, ElementsAre(2, 3));
}

TEST(CensusTest, AViewWithAnOutOfRangeNodeIndexCountsForNothing) {
  v1::CommState odd = View(1);
  odd.set_node_index(7);
  const Census c = TakeCensus(Layout(), {View(0), odd, View(2)}, {});
  EXPECT_THAT(c.lost_ranks, ElementsAre(2, 3));
}

TEST(CensusTest, OneNodeCommunicatorKeepsItsLocalCoordinator) {
  CensusLayout l;
  l.nranks = 3;
  l.node_of_rank = {0, 0, 0};
  l.node_names = {"solo"};
  l.node_addresses = {""};
  l.coordinator = "local:solo";
  v1::CommState v;
  v.set_node_index(0);
  for (int r = 0; r < 3; ++r) {
    v1::RankProgress* p = v.add_ranks();
    p->set_rank(r);
    p->set_left(r == 1);
  }
  const Census c = TakeCensus(l, {v}, {});
  EXPECT_THAT(c.lost_ranks, ElementsAre(1));
  EXPECT_EQ(c.coordinator, "local:solo");
}

}  // namespace
}  // namespace railyard::diagnose
