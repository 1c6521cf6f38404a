// PeerConfirmsRailStall with hand-made views: a peer that finished the operation, or runs it and
// waits as long on the same rail to this node, confirms; a late, behind, failed or otherwise
// waiting peer does not.
#include "daemon/diagnose/rail_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace railyard::diagnose {
namespace {

using ::testing::Optional;

// Node 1's view: its two ranks have completed up to `completed` (their next collective); when
// running, its front is seq `front_seq` with one transfer with node 0.
v1::CommState View(uint64_t completed, bool running, uint64_t front_seq = 0, int rail = 1,
                   double age = 5.0, bool send = false) {
  v1::CommState v;
  v.set_state("ready");
  v.set_node_index(1);
  for (int r : {2, 3}) {
    v1::RankProgress* p = v.add_ranks();
    p->set_rank(r);
    p->set_submitted(completed + 1);
    p->set_completed(completed);
  }
  if (running) {
    v1::OpProgress* f = v.mutable_front();
    f->set_seq(front_seq);
    f->set_running(true);
    v1::TransferProgress* t = f->add_transfers();
    t->set_send(send);
    t->set_peer_node(0);
    t->set_peer_name("n0");
    t->set_rail(rail);
    t->set_age_seconds(age);
  }
  return v;
}

const RailSuspect kSuspect{/*seq=*/7, /*my_node=*/0, /*rail=*/1, /*timeout_s=*/2.0};

TEST(RailCheckTest, APeerThatFinishedTheOperationConfirms) {
  EXPECT_THAT(PeerConfirmsRailStall(View(8, false), kSuspect),
              Optional(std::string("finished seq 7")));
  EXPECT_THAT(PeerConfirmsRailStall(View(9, true, 9), kSuspect),
              Optional(std::string("finished seq 7")));
}

TEST(RailCheckTest, APeerWaitingOnTheSameRailForThisNodeConfirms) {
  EXPECT_THAT(PeerConfirmsRailStall(View(7, true, 7), kSuspect),
              Optional(std::string("waits 5.0 s for its chunk from n0 on rail1 too")));
  EXPECT_THAT(PeerConfirmsRailStall(View(7, true, 7, 1, 2.5, true), kSuspect),
              Optional(std::string("waits 2.5 s for its send to n0 on rail1 too")));
}

TEST(RailCheckTest, ALatePeerOrOneWaitingElsewhereConfirmsNothing) {
  EXPECT_EQ(PeerConfirmsRailStall(View(7, false), kSuspect), std::nullopt);       // not submitted
  EXPECT_EQ(PeerConfirmsRailStall(View(6, true, 6), kSuspect), std::nullopt);     // behind
  EXPECT_EQ(PeerConfirmsRailStall(View(7, true, 7, 0), kSuspect), std::nullopt);  // rail 0
  EXPECT_EQ(PeerConfirmsRailStall(View(7, true, 7, 1, 1.0), kSuspect), std::nullopt);  // young
  v1::CommState other = View(7, true, 7);
  other.mutable_front()->mutable_transfers(0)->set_peer_node(2);  // waits for a third node
  EXPECT_EQ(PeerConfirmsRailStall(other, kSuspect), std::nullopt);
  v1::CommState not_running = View(7, true, 7);
  not_running.mutable_front()->set_running(false);
  EXPECT_EQ(PeerConfirmsRailStall(not_running, kSuspect), std::nullopt);
}

TEST(RailCheckTest, AFailedJoiningOrEmptyViewConfirmsNothing) {
  v1::CommState failed = View(8, false);
  failed.set_state("failed");
  EXPECT_EQ(PeerConfirmsRailStall(failed, kSuspect), std::nullopt);
  v1::CommState joining = View(8, false);
  joining.set_state("joining");
  EXPECT_EQ(PeerConfirmsRailStall(joining, kSuspect), std::nullopt);
  v1::CommState empty;
  empty.set_state("ready");
  EXPECT_EQ(PeerConfirmsRailStall(empty, kSuspect), std::nullopt);
  // One rank past seq, another not: not finished.
  v1::CommState mixed = View(8, false);
  mixed.mutable_ranks(1)->set_completed(7);
  EXPECT_EQ(PeerConfirmsRailStall(mixed, kSuspect), std::nullopt);
}

}  // namespace
}  // namespace railyard::diagnose
