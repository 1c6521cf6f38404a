// MappedSegment::MapMemfd with real memfds: what a client must do (create with sealing allowed,
// allocate, seal against shrink/grow/seal changes) and every descriptor an attacker might send
// instead, each refused with a status that says what is wrong.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "daemon/session/shm_segment.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

constexpr int kAllSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// A memfd of `size` bytes, allocated when `allocate`, with `seals` added.
UniqueFd Memfd(size_t size, int seals, bool allocate = true) {
  UniqueFd fd(::memfd_create("railyard.unit", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  if (allocate) {
    EXPECT_EQ(::fallocate(fd.get(), 0, 0, static_cast<off_t>(size)), 0);
  } else {
    EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  }
  if (seals != 0) {
    EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, seals), 0);
  }
  return fd;
}

UniqueFd Dup(const UniqueFd& fd) { return UniqueFd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0)); }

TEST(MemfdMappingTest, ASealedAllocatedMemfdMapsZeroCopyAndCanNoLongerShrink) {
  UniqueFd fd = Memfd(8192, kAllSeals);
  void* client = ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(client, MAP_FAILED);
  auto seg = MappedSegment::MapMemfd(Dup(fd), 8192);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_THAT((*seg)->name(), HasSubstr("memfd:railyard.unit"));
  static_cast<char*>(client)[100] = 42;
  EXPECT_EQ(static_cast<char>((*seg)->data()[100]), 42);
  (*seg)->data()[200] = std::byte{7};
  EXPECT_EQ(static_cast<char*>(client)[200], 7);
  // The attack that killed the daemon with SIGBUS: shrink the buffer after registering it.
  EXPECT_NE(::ftruncate(fd.get(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(fd.get(), 1 << 20), 0);  // nor grow it
  (*seg)->data()[8191] = std::byte{1};           // still mapped, still there
  EXPECT_EQ(static_cast<char*>(client)[8191], 1);
  ::munmap(client, 8192);
  EXPECT_TRUE((*seg)->CheckRange(0, 8192, 4).ok());
  EXPECT_TRUE((*seg)->CheckRange(8192, 0, 4).ok());
  EXPECT_THAT(std::string((*seg)->CheckRange(8000, 200, 4).message()), HasSubstr("by 8 bytes"));
  EXPECT_THAT(std::string((*seg)->CheckRange(2, 4, 4).message()), HasSubstr("multiple"));
  EXPECT_FALSE((*seg)->CheckRange(~uint64_t{0}, 2, 1).ok());
  EXPECT_FALSE((*seg)->CheckRange(8, ~uint64_t{0}, 1).ok());
}

TEST(MemfdMappingTest, APrefixOfALargerMemfdMaps) {
  auto seg = MappedSegment::MapMemfd(Memfd(16384, kAllSeals), 4096);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ((*seg)->size(), 4096u);
}

TEST(MemfdMappingTest, EachMissingSealIsRefusedByName) {
  struct Case {
    int seals;
    const char* missing;
  };
  for (const Case& c : {Case{0, "F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL"},
                        Case{F_SEAL_GROW | F_SEAL_SEAL, "F_SEAL_SHRINK"},
                        Case{F_SEAL_SHRINK | F_SEAL_SEAL, "F_SEAL_GROW"},
                        Case{F_SEAL_SHRINK | F_SEAL_GROW, "F_SEAL_SEAL"}}) {
    auto seg = MappedSegment::MapMemfd(Memfd(4096, c.seals), 4096);
    EXPECT_EQ(seg.status().code(), absl::StatusCode::kInvalidArgument) << c.missing;
    EXPECT_THAT(std::string(seg.status().message()), HasSubstr(std::string("lacks ") + c.missing));
  }
}

TEST(MemfdMappingTest, WriteSealedReadOnlyAndNonMemfdDescriptorsAreRefused) {
  auto write_sealed = MappedSegment::MapMemfd(Memfd(4096, kAllSeals | F_SEAL_WRITE), 4096);
  EXPECT_EQ(write_sealed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(write_sealed.status().message()), HasSubstr("sealed against writes"));

  UniqueFd rw = Memfd(4096, kAllSeals);
  UniqueFd ro(::open(("/proc/self/fd/" + std::to_string(rw.get())).c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(ro.valid());
  auto read_only = MappedSegment::MapMemfd(std::move(ro), 4096);
  EXPECT_EQ(read_only.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(read_only.status().message()), HasSubstr("not open read-write"));

  // A regular file (what a name in a shared directory would be) cannot be sealed at all.
  UniqueFd file(::open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  ASSERT_TRUE(file.valid());
  ASSERT_EQ(::ftruncate(file.get(), 4096), 0);
  auto regular = MappedSegment::MapMemfd(std::move(file), 4096);
  EXPECT_EQ(regular.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(regular.status().message()), HasSubstr("cannot be sealed"));

  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd write_end(p[1]);
  auto pipe = MappedSegment::MapMemfd(UniqueFd(p[0]), 4096);
  EXPECT_EQ(pipe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(pipe.status().message()), HasSubstr("not a memfd"));

  EXPECT_EQ(MappedSegment::MapMemfd(UniqueFd(), 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MemfdMappingTest, TooSmallSparseAndEmptyRegistrationsAreRefused) {
  auto small = MappedSegment::MapMemfd(Memfd(4096, kAllSeals), 8192);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(small.status().message()), HasSubstr("smaller than the 8192 bytes"));
  // Never allocated: the daemon's pre-fault would allocate (and be charged for) it.
  auto sparse = MappedSegment::MapMemfd(Memfd(1 << 20, kAllSeals, /*allocate=*/false), 1 << 20);
  EXPECT_EQ(sparse.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(sparse.status().message()), HasSubstr("allocate it"));
  EXPECT_EQ(MappedSegment::MapMemfd(Memfd(4096, kAllSeals), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MemfdMappingTest, TheMappingHoldsItsQuotaUntilItIsUnmapped) {
  QuotaLimits limits = QuotaLimits::Defaults();
  auto job = std::make_shared<JobUsage>("j");
  auto account = std::make_shared<QuotaAccount>(&limits, job);
  {
    auto seg = MappedSegment::MapMemfd(Memfd(4096, kAllSeals), 4096);
    ASSERT_TRUE(seg.ok());
    QuotaCharge count, bytes;
    ASSERT_TRUE(QuotaCharge::Take(account, Resource::kBuffers, 1, &count).ok());
    ASSERT_TRUE(QuotaCharge::Take(account, Resource::kBufferBytes, 4096, &bytes).ok());
    (*seg)->HoldCharges(std::move(count), std::move(bytes));
    EXPECT_EQ(job->used(Resource::kBufferBytes), 4096u);
  }
  EXPECT_EQ(job->used(Resource::kBufferBytes), 0u);
  EXPECT_EQ(account->used(Resource::kBuffers), 0u);
}

}  // namespace
}  // namespace railyard
