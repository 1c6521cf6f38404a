// --cpus: the CPU list syntax, its errors, and pinning every thread of the process.
#include "daemon/topology/cpu_affinity.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/topology/topology_graph.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The syntax is topology::ParseCpuList's (tests/unit/topology_graph_test.cc); a mask adds that
// it names at least one CPU and none beyond CPU_SETSIZE.
TEST(CpuMaskTest, ParsesTheKernelSyntaxIntoSortedCpus) {
  EXPECT_THAT(*ParseCpuMask("0"), ElementsAre(0));
  EXPECT_THAT(*ParseCpuMask("3,1"), ElementsAre(1, 3));
  EXPECT_THAT(*ParseCpuMask("0-3,8,10-11"), ElementsAre(0, 1, 2, 3, 8, 10, 11));
  EXPECT_THAT(*ParseCpuMask("2-2,1-3,2"), ElementsAre(1, 2, 3));
  EXPECT_THAT(*ParseCpuMask("1023"), ElementsAre(1023));
}

TEST(CpuMaskTest, RefusesWhatIsNotAMask) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"", "the CPU list names no CPU"},
           {" \n", "the CPU list names no CPU"},
           {"1,,2", "bad cpulist '1,,2': '' is not N or N-M"},
           {"a", "bad cpulist 'a': 'a' is not N or N-M"},
           {"-1", "'-1' is not N or N-M"},
           {"1-", "'1-' is not N or N-M"},
           {"1-2-3", "'1-2-3' is not N or N-M"},
           {"+1", "'+1' is not N or N-M"},
           {"0x1", "'0x1' is not N or N-M"},
           {"1 2", "'1 2' is not N or N-M"},
           {"99999999999", "'99999999999' is not N or N-M"},
           {"3-1", "range '3-1' is empty or out of range"},
           {"1024", "CPU 1024 is beyond the largest CPU number, 1023"},
           {"0-4096", "CPU 4096 is beyond the largest CPU number, 1023"},
           {"0-1048576", "range '0-1048576' is empty or out of range"},
       }) {
    absl::StatusOr<std::vector<int>> got = ParseCpuMask(c.text);
    ASSERT_FALSE(got.ok()) << "\"" << c.text << "\"";
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(got.status().message(), HasSubstr(c.message)) << c.text;
  }
}

std::vector<int> CpusOf(pid_t tid) {
  absl::StatusOr<std::vector<int>> cpus = AllowedCpus(tid);
  EXPECT_TRUE(cpus.ok()) << cpus.status();
  return cpus.ok() ? *cpus : std::vector<int>{};
}

// Pins a thread that already runs and the ones started afterwards; a CPU the process may not run
// on changes nothing and says which.
TEST(PinProcessTest, PinsEveryThreadAndRefusesCpusOutsideTheAllowedSet) {
  const absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  ASSERT_FALSE(allowed->empty());

  std::atomic<pid_t> before_tid{0};
  std::atomic<bool> done{false};
  std::thread before([&] {
    before_tid = static_cast<pid_t>(syscall(SYS_gettid));
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (before_tid == 0) std::this_thread::yield();

  // One CPU outside the allowed set (none is, on a host with every CPU allowed and 1024 of them).
  int outside = -1;
  for (int cpu = 0; cpu < kMaxCpus && outside < 0; ++cpu) {
    if (!std::binary_search(allowed->begin(), allowed->end(), cpu)) outside = cpu;
  }
  if (outside >= 0) {
    absl::Status s = PinProcessToCpus({allowed->front(), outside});
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("CPU(s) ", outside, " are not among")));
    EXPECT_THAT(s.message(), HasSubstr("it runs on " + topology::FormatCpuList(*allowed)));
    EXPECT_EQ(CpusOf(0), *allowed) << "a refused list changed nothing";
    EXPECT_EQ(CpusOf(before_tid), *allowed) << "a refused list changed nothing";
    EXPECT_EQ(PinProcessToCpus({outside}).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(CpusOf(0), *allowed);
  }
  EXPECT_EQ(PinProcessToCpus({}).code(), absl::StatusCode::kInvalidArgument);

  const int one = allowed->back();
  ASSERT_TRUE(PinProcessToCpus({one}).ok());
  EXPECT_THAT(CpusOf(0), ElementsAre(one));
  EXPECT_THAT(CpusOf(before_tid), ElementsAre(one));
  std::vector<int> after_cpus;
  std::thread after([&] { after_cpus = CpusOf(0); });
  after.join();
  EXPECT_THAT(after_cpus, ElementsAre(one));
  EXPECT_THAT(*AllowedCpus(), ElementsAre(one));

  done = true;
  before.join();
  // Widening back to what the process may run on is allowed (as sched_setaffinity allows it).
  ASSERT_TRUE(PinProcessToCpus(*allowed).ok());
  EXPECT_EQ(CpusOf(0), *allowed);
}

}  // namespace
}  // namespace railyard
