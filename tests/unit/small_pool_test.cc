// The C++ client's SmallPool with a fake slab allocator (no daemon): size classes share slabs,
// chunks do not overlap and are aligned to their class, a chunk comes back when its lease goes,
// a slab stays mapped while a chunk of it lives (even after the pool is gone), and a failed slab
// allocation is the caller's error.
#include "client/cpp/small_pool.h"

#include <cstdlib>
#include <memory>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace railyard::internal {
namespace {

struct FakeSlabs {
  int made = 0;
  int freed = 0;
  bool fail = false;
  SmallPool::SlabAllocator Allocator() {
    return [this](size_t size) -> absl::StatusOr<SmallPool::Slab> {
      if (fail) return absl::ResourceExhaustedError("no more mappings (--max_mappings_per_job)");
      SmallPool::Slab slab;
      slab.buffer_id = static_cast<uint64_t>(++made);
      slab.data = static_cast<std::byte*>(std::aligned_alloc(4096, size));
      slab.owner = std::shared_ptr<void>(slab.data, [this](void* p) {
        std::free(p);
        ++freed;
      });
      return slab;
    };
  }
};

TEST(SmallPoolTest, ChunksOfAClassShareASlabDoNotOverlapAndComeBack) {
  FakeSlabs slabs;
  SmallPool pool(slabs.Allocator());
  std::vector<SmallPool::Chunk> chunks;
  std::set<size_t> offsets;
  const size_t per_slab = SmallPool::kSlabBytes / 4096;
  for (size_t i = 0; i < per_slab; ++i) {
    auto c = pool.Take(4000);  // class 4096
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->offset % 4096, 0u);
    EXPECT_TRUE(offsets.insert(c->offset).second) << "offset " << c->offset << " twice";
    chunks.push_back(*std::move(c));
  }
  EXPECT_EQ(slabs.made, 1);
  auto next = pool.Take(3000);  // the slab is full: a second one
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(slabs.made, 2);
  EXPECT_EQ(next->buffer_id, 2u);
  // Another class has slabs of its own.
  auto small = pool.Take(10);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(slabs.made, 3);
  // A chunk given back is taken again, without a new slab.
  const size_t returned = chunks[7].offset;
  chunks[7].lease.reset();
  auto again = pool.Take(4096);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->buffer_id, 1u);
  EXPECT_EQ(again->offset, returned);
  EXPECT_EQ(slabs.made, 3);
  EXPECT_EQ(pool.slabs(), 3u);
}

TEST(SmallPoolTest, ASlabOutlivesThePoolWhileAChunkOfItLives) {
  FakeSlabs slabs;
  SmallPool::Chunk kept;
  {
    SmallPool pool(slabs.Allocator());
    auto c = pool.Take(100);
    ASSERT_TRUE(c.ok());
    kept = *std::move(c);
    auto other = pool.Take(100000);  // its own class and slab, no chunk kept
    ASSERT_TRUE(other.ok());
  }
  EXPECT_EQ(slabs.freed, 1);    // the slab no chunk holds
  kept.data[0] = std::byte{1};  // still mapped
  kept.lease.reset();
  EXPECT_EQ(slabs.freed, 2);
}

TEST(SmallPoolTest, AFailedSlabIsTheCallersErrorAndOnlySmallSizesArePooled) {
  FakeSlabs slabs;
  slabs.fail = true;
  SmallPool pool(slabs.Allocator());
  auto c = pool.Take(64);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(SmallPool::Pooled(1));
  EXPECT_TRUE(SmallPool::Pooled(SmallPool::kMaxPooled));
  EXPECT_FALSE(SmallPool::Pooled(SmallPool::kMaxPooled + 1));
  EXPECT_FALSE(SmallPool::Pooled(0));
}

}  // namespace
}  // namespace railyard::internal
