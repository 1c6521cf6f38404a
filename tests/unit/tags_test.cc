// The data plane's tag layout over its field limits, and the per-daemon slot table.
#include "daemon/scheduler/tags.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace railyard::scheduler::tags {
namespace {

constexpr SlotValue kMaxSlotValue = static_cast<SlotValue>((1u << kSlotBits) - 1);

TEST(TagLayoutTest, CollectiveFieldsRoundTripAtTheirLimits) {
  for (SlotValue slot : {SlotValue{0}, SlotValue{1}, SlotValue{0x1234}, kMaxSlotValue}) {
    for (int node : {0, 1, kMaxNodes - 1}) {
      for (uint64_t seq : {uint64_t{0}, uint64_t{1}, kMaxP2pInFlight - 1}) {
        for (uint64_t step : {uint64_t{0}, uint64_t{1}, kMaxStepTags - 1}) {
          const Fields f = Decode(CollectiveTag(slot, node, seq, step));
          EXPECT_FALSE(f.point_to_point);
          EXPECT_EQ(f.slot, slot);
          EXPECT_EQ(f.sender_node, static_cast<uint32_t>(node));
          EXPECT_EQ(f.seq, seq);
          EXPECT_EQ(f.step, step);
        }
      }
    }
  }
}

TEST(TagLayoutTest, PointToPointFieldsRoundTripAtTheirLimits) {
  for (SlotValue slot : {SlotValue{0}, SlotValue{7}, kMaxSlotValue}) {
    for (int src : {0, 1, kMaxRanks - 1}) {
      for (int dst : {0, 2, kMaxRanks - 1}) {
        for (uint64_t seq : {uint64_t{0}, uint64_t{3}, kMaxP2pInFlight - 1}) {
          const Fields f = Decode(PointToPointTag(slot, src, dst, seq));
          EXPECT_TRUE(f.point_to_point);
          EXPECT_EQ(f.slot, slot);
          EXPECT_EQ(f.src_rank, static_cast<uint32_t>(src));
          EXPECT_EQ(f.dst_rank, static_cast<uint32_t>(dst));
          EXPECT_EQ(f.seq, seq);
        }
      }
    }
  }
}

// Every combination of edge values gives a different tag: no field bleeds into another, and
// point-to-point tags never equal collective ones, whatever their fields.
TEST(TagLayoutTest, DistinctFieldsGiveDistinctTagsAndKindsAreDisjoint) {
  std::set<transport::Tag> seen;
  size_t made = 0;
  const std::vector<SlotValue> slots = {0, 1, 2, 0x10, kMaxSlotValue - 1, kMaxSlotValue};
  for (SlotValue slot : slots) {
    for (int node : {0, 1, 2, kMaxNodes - 2, kMaxNodes - 1}) {
      for (uint64_t seq : {uint64_t{0}, uint64_t{1}, kMaxP2pInFlight - 1}) {
        for (uint64_t step : {uint64_t{0}, uint64_t{1}, kMaxStepTags - 2, kMaxStepTags - 1}) {
          seen.insert(CollectiveTag(slot, node, seq, step));
          ++made;
        }
      }
    }
    for (int src : {0, 1, kMaxRanks - 1}) {
      for (int dst : {0, 1, kMaxRanks - 1}) {
        for (uint64_t seq : {uint64_t{0}, uint64_t{1}, kMaxP2pInFlight - 1}) {
          const transport::Tag t = PointToPointTag(slot, src, dst, seq);
          EXPECT_NE(t >> 63, 0u);
          seen.insert(t);
          ++made;
        }
      }
    }
  }
  EXPECT_EQ(seen.size(), made);
}

// The old scheme's failure: two communicators at the same sequence number and step, from the
// same sender node index. With their own slots their tags differ.
TEST(TagLayoutTest, TwoCommunicatorsInLockstepNeverShareATag) {
  TagSlotTable table;
  auto a = table.Acquire();
  auto b = table.Acquire();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_NE((*a)->value(), (*b)->value());
  for (uint64_t seq = 0; seq < 40; ++seq) {
    for (uint64_t step = 0; step < 40; ++step) {
      EXPECT_NE(CollectiveTag((*a)->value(), 1, seq, step),
                CollectiveTag((*b)->value(), 1, seq, step));
      EXPECT_NE(PointToPointTag((*a)->value(), 0, 1, seq),
                PointToPointTag((*b)->value(), 0, 1, seq));
    }
  }
}

TEST(TagLayoutTest, SequenceNumbersWrapAfterTheirBits) {
  EXPECT_EQ(CollectiveTag(5, 3, kMaxP2pInFlight + 7, 9), CollectiveTag(5, 3, 7, 9));
  EXPECT_EQ(PointToPointTag(5, 3, 4, kMaxP2pInFlight + 2), PointToPointTag(5, 3, 4, 2));
}

TEST(TagSlotTableTest, HandsOutDistinctSlotsAndRefusesPastCapacity) {
  TagSlotTable table(8);
  std::vector<std::shared_ptr<const Slot>> held;
  std::set<SlotValue> values;
  for (int i = 0; i < 8; ++i) {
    auto s = table.Acquire();
    ASSERT_TRUE(s.ok()) << s.status();
    values.insert((*s)->value());
    held.push_back(*s);
  }
  EXPECT_EQ(values.size(), 8u);
  EXPECT_EQ(table.in_use(), 8);
  auto over = table.Acquire();
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("multi-node communicators"), std::string::npos);
  held.clear();
  EXPECT_EQ(table.in_use(), 0);
}

// A communicator re-created in a slot index its predecessor used gets a new generation: the
// leftovers of the old one (tagged with the old value) cannot match it.
TEST(TagSlotTableTest, AReusedIndexCarriesANewGeneration) {
  TagSlotTable table(1);
  std::set<SlotValue> values;
  for (int round = 0; round < (1 << kSlotGenerationBits); ++round) {
    auto s = table.Acquire();
    ASSERT_TRUE(s.ok());
    EXPECT_EQ((*s)->value() >> kSlotGenerationBits, 0);
    values.insert((*s)->value());
  }
  EXPECT_EQ(values.size(), size_t{1} << kSlotGenerationBits);
}

// Freed indices go to the back of the queue: with others free, a freed slot is not the next one.
TEST(TagSlotTableTest, FreedIndicesAreReusedLast) {
  TagSlotTable table(4);
  SlotValue first;
  {
    auto s = table.Acquire();
    ASSERT_TRUE(s.ok());
    first = (*s)->value();
  }
  for (int i = 0; i < 3; ++i) {
    auto s = table.Acquire();
    ASSERT_TRUE(s.ok());
    EXPECT_NE((*s)->value() >> kSlotGenerationBits, first >> kSlotGenerationBits);
  }
}

// Slots keep their table's state alive: after the table object is gone each keeps its value, and
// releasing them touches no freed memory (the ASan build checks that part).
TEST(TagSlotTableTest, SlotsMayOutliveTheirTable) {
  std::shared_ptr<const Slot> a, b;
  SlotValue a_value = 0, b_value = 0;
  {
    TagSlotTable table(2);
    auto got_a = table.Acquire();
    auto got_b = table.Acquire();
    ASSERT_TRUE(got_a.ok());
    ASSERT_TRUE(got_b.ok());
    a = *got_a;
    b = *got_b;
    a_value = a->value();
    b_value = b->value();
    EXPECT_EQ(table.in_use(), 2);
    EXPECT_FALSE(table.Acquire().ok()) << "a table of 2 handed out a third slot";
  }
  EXPECT_EQ(a->value(), a_value);
  EXPECT_EQ(b->value(), b_value);
  EXPECT_NE(a_value, b_value);
  EXPECT_EQ(a.use_count(), 1);
  a.reset();
  b.reset();
}

TEST(TagLayoutTest, DescribeNamesTheFields) {
  EXPECT_EQ(Describe(CollectiveTag((3 << kSlotGenerationBits) | 2, 1, 4, 5)),
            "collective slot 3.2 from node 1 seq 4 step 5");
  EXPECT_EQ(Describe(PointToPointTag(1 << kSlotGenerationBits, 6, 7, 8)),
            "p2p slot 1.0 rank 6->7 seq 8");
}

}  // namespace
}  // namespace railyard::scheduler::tags
