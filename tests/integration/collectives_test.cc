// Every collective x dtypes x redops x odd counts, in place and out of place, among 1, 2, 3, 4
// and 7 real rank processes served by a real railyardd, over the session rings (the default)
// and over gRPC Submit (RAILYARD_FASTPATH=0). Each rank checks its output byte for byte.
#include <cstdlib>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/rank_cases.h"

namespace railyard::testing {
namespace {

class CollectivesTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(CollectivesTest, EveryCollectiveIsExact) {
  const int nranks = std::get<0>(GetParam());
  const bool rings = std::get<1>(GetParam());
  // The rank processes inherit it (each test is its own process under ctest).
  setenv("RAILYARD_FASTPATH", rings ? "1" : "0", 1);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  auto coordinator = Client::Connect(daemon.Options());
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto comm_id = (*coordinator)->CreateCommId();
  ASSERT_TRUE(comm_id.ok()) << comm_id.status();

  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < nranks; ++r) {
    ranks.push_back(std::make_unique<Process>(
        std::vector<std::string>{RANK_PATH, "--mode=cases", "--socket=" + daemon.socket(),
                                 "--comm_id=" + *comm_id, "--rank=" + std::to_string(r),
                                 "--nranks=" + std::to_string(nranks)},
        daemon.dir() + "/rank" + std::to_string(r) + ".log"));
  }
  const size_t ncases = AllCases(nranks).size();
  for (int r = 0; r < nranks; ++r) {
    auto code = ranks[r]->Wait(std::chrono::seconds(300));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " did not finish";
    EXPECT_EQ(*code, 0) << "rank " << r << ":\n" << ranks[r]->Output();
    EXPECT_NE(ranks[r]->Output().find("PASS " + std::to_string(ncases)), std::string::npos)
        << ranks[r]->Output();
  }
  // Every operation completed and nothing failed; the ranks' sessions and buffers are gone.
  v1::StatusResponse st = daemon.Status();
  EXPECT_EQ(st.ops_failed(), 0u);
  // The path asked for is the path taken: the coordinator's session (this process) says which.
  ASSERT_EQ(st.sessions_size(), 1);
  EXPECT_EQ(st.sessions(0).rings(), rings);
  EXPECT_GE(st.ops_completed(), ncases);
  EXPECT_EQ(st.sessions_size(), 1);  // the coordinator's own session
  EXPECT_EQ(st.buffers(), 0u);
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 7), ::testing::Bool()),
                         [](const auto& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_rings" : "_grpc");
                         });

}  // namespace
}  // namespace railyard::testing
