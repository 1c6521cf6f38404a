// The pool of page-locked staging buffers (daemon/device/staging_pool.h) on the fake device
// runtime: size classes, reuse, the bound on idle memory and what it frees first, leases that
// outlive the pool, and a failed allocation.
#include "daemon/device/staging_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include "daemon/device/fake_device_runtime.h"

namespace railyard::device {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(StagingPoolTest, ClassesAreFourPerDoublingFrom64KiB) {
  EXPECT_EQ(StagingPool::ClassOf(1), 64u << 10);
  EXPECT_EQ(StagingPool::ClassOf(64 << 10), 64u << 10);
  EXPECT_EQ(StagingPool::ClassOf((64 << 10) + 1), 80u << 10);
  EXPECT_EQ(StagingPool::ClassOf(kMiB), kMiB);
  EXPECT_EQ(StagingPool::ClassOf(kMiB + 1), kMiB + kMiB / 4);
  EXPECT_EQ(StagingPool::ClassOf(3 * kMiB), 3 * kMiB);
  EXPECT_EQ(StagingPool::ClassOf(3 * kMiB + 1), 3 * kMiB + kMiB / 2);
  EXPECT_EQ(StagingPool::ClassOf(uint64_t{1} << 40), uint64_t{1} << 40);
  for (uint64_t b = (64 << 10) + 1; b < (uint64_t{1} << 34); b = b * 13 / 7 + 1) {
    const uint64_t c = StagingPool::ClassOf(b);
    EXPECT_GE(c, b);
    EXPECT_LE(c, b + b / 4) << b;
    EXPECT_EQ(StagingPool::ClassOf(c), c) << b;
  }
}

TEST(StagingPoolTest, AReturnedBufferServesTheNextRequestOfItsClass) {
  FakeDeviceRuntime rt(1);
  StagingPool pool(&rt, 16 * kMiB);
  std::byte* first = nullptr;
  {
    absl::StatusOr<StagingPool::Lease> a = pool.Take(kMiB);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->capacity(), kMiB);
    first = a->data();
    std::memset(first, 0x5a, kMiB);  // writable, every byte
    EXPECT_EQ(pool.stats().leased_bytes, kMiB);
  }
  EXPECT_EQ(pool.stats().idle_bytes, kMiB);
  absl::StatusOr<StagingPool::Lease> b = pool.Take(kMiB - 5);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), first);
  absl::StatusOr<StagingPool::Lease> c = pool.Take(kMiB + 1);  // another class: a new buffer
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->data(), first);
  EXPECT_EQ(c->capacity(), kMiB + kMiB / 4);
  const StagingPool::Stats s = pool.stats();
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.reuses, 1u);
  EXPECT_EQ(s.idle_bytes, 0u);
  EXPECT_EQ(s.leased_bytes, 2 * kMiB + kMiB / 4);
  EXPECT_EQ(rt.pinned_allocations(), 2u);
}

TEST(StagingPoolTest, IdleMemoryStaysWithinTheBoundAndTheLargestGoFirst) {
  FakeDeviceRuntime rt(1);
  StagingPool pool(&rt, 3 * kMiB);
  std::optional<StagingPool::Lease> a(*pool.Take(2 * kMiB)), b(*pool.Take(kMiB)),
      c(*pool.Take(kMiB));
  a.reset();
  b.reset();  // 2 MiB + 1 MiB idle: at the bound
  EXPECT_EQ(pool.stats().idle_bytes, 3 * kMiB);
  c.reset();  // no room: the largest idle buffer (2 MiB) is freed
  StagingPool::Stats s = pool.stats();
  EXPECT_EQ(s.idle_bytes, 2 * kMiB);
  EXPECT_EQ(s.idle_buffers, 2u);
  EXPECT_EQ(s.leased_bytes, 0u);
  // 2 MiB again: allocated anew; when it comes back a 1 MiB one makes room for it.
  { StagingPool::Lease big = *pool.Take(2 * kMiB); }
  s = pool.stats();
  EXPECT_EQ(s.allocations, 4u);
  EXPECT_EQ(s.idle_bytes, 3 * kMiB);
  EXPECT_EQ(s.idle_buffers, 2u);
  // A buffer larger than the bound is never kept, and frees nothing else.
  { StagingPool::Lease huge = *pool.Take(4 * kMiB); }
  s = pool.stats();
  EXPECT_EQ(s.idle_bytes, 3 * kMiB);
  EXPECT_EQ(s.idle_buffers, 2u);
  EXPECT_EQ(s.allocations, 5u);
}

TEST(StagingPoolTest, ABoundOfZeroKeepsNothing) {
  FakeDeviceRuntime rt(1);
  StagingPool pool(&rt, 0);
  for (int i = 0; i < 3; ++i) {
    StagingPool::Lease l = *pool.Take(4096);
  }
  EXPECT_EQ(pool.stats().allocations, 3u);
  EXPECT_EQ(pool.stats().idle_bytes, 0u);
}

TEST(StagingPoolTest, LeasesMayOutliveThePoolAndMoveAssignmentReturnsTheOldBuffer) {
  FakeDeviceRuntime rt(1);
  std::optional<StagingPool::Lease> kept;
  {
    StagingPool pool(&rt, 8 * kMiB);
    StagingPool::Lease a = *pool.Take(kMiB);
    StagingPool::Lease b = *pool.Take(2 * kMiB);
    a = std::move(b);  // a's 1 MiB goes back to the pool
    EXPECT_EQ(pool.stats().idle_bytes, kMiB);
    EXPECT_EQ(a.capacity(), 2 * kMiB);
    kept.emplace(std::move(a));
  }
  // The pool is gone: the buffer frees itself (ASan would see a leak or a double free).
  std::memset(kept->data(), 1, kept->capacity());
  kept.reset();
}

TEST(StagingPoolTest, AFailedAllocationSaysWhatWasBeingStaged) {
  FakeDeviceRuntime rt(1);
  StagingPool pool(&rt, kMiB);
  absl::StatusOr<StagingPool::Lease> l = pool.Take(uint64_t{1} << 60);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(l.status().message().find("staging 1152921504606846976 bytes of device memory"),
            std::string::npos)
      << l.status();
  EXPECT_EQ(pool.Take(0).status().code(), absl::StatusCode::kInvalidArgument);
  // Sizes whose class would wrap around 2^64 are refused, not rounded to a small buffer.
  EXPECT_EQ(pool.Take(~uint64_t{0}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.Take((uint64_t{1} << 63) + 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_GE(StagingPool::ClassOf(~uint64_t{0}), ~uint64_t{0});
  EXPECT_EQ(pool.stats().allocations, 0u);
}

}  // namespace
}  // namespace railyard::device
