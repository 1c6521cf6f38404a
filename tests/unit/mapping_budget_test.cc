// MappingBudget on its own: a job's mappings stop at its share while other jobs are served, the
// budget is a backstop, a mapping comes back when its token goes, and the default budget is
// below the kernel's vm.max_map_count.
#include "daemon/session/mapping_budget.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

TEST(MappingBudgetTest, AJobStopsAtItsShareOthersAreServedAndTokensGiveBack) {
  MappingBudget budget(/*total=*/5, /*per_job=*/3);
  std::vector<std::shared_ptr<void>> held;
  for (int i = 0; i < 3; ++i) {
    auto t = budget.Take("hog");
    ASSERT_TRUE(t.ok()) << t.status();
    held.push_back(*std::move(t));
  }
  auto refused = budget.Take("hog");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("job hog holds 3 of the daemon's memory mappings, its share "
                        "(--max_mappings_per_job)"));
  auto a = budget.Take("a");
  auto b = budget.Take("b");
  ASSERT_TRUE(a.ok() && b.ok());
  auto full = budget.Take("c");
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("(--max_mappings"));
  held.pop_back();  // one of hog's buffers is unmapped
  EXPECT_EQ(budget.held_by("hog"), 2u);
  EXPECT_TRUE(budget.Take("c").ok());  // its token is dropped at once: given back again
  EXPECT_EQ(budget.held(), 4u);
}

TEST(MappingBudgetTest, TheDefaultBudgetLeavesTheDaemonRoomBelowTheKernelsLimit) {
  MappingBudget budget(0, 0);
  EXPECT_EQ(budget.total(), MappingBudget::KernelLimit() / 4 * 3);
  EXPECT_LT(budget.total(), MappingBudget::KernelLimit());
  EXPECT_EQ(budget.per_job(), budget.total() / 4);
}

}  // namespace
}  // namespace railyard
