// Every collective x dtypes x redops x odd counts, in place and out of place, among 1, 2, 3, 4
// and 7 real rank processes served by a real railyardd, over the session rings (the default)
// and over gRPC Submit (RAILYARD_FASTPATH=0). Each rank checks its output byte for byte.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

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

namespace railyard::testing {
namespace {

// Two ranks (threads, one session each) submit groups of small AllReduces (GroupStart/GroupEnd):
// mixed dtypes and reductions split a group where they change; every result is exact, each
// operation completes on its own, and a Work completes by polling test() alone.
TEST(GroupTest, GroupedSmallCollectivesAreEachExactAndCompleteOnTheirOwn) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  auto c0 = Client::Connect(daemon.Options());
  auto c1 = Client::Connect(daemon.Options());
  ASSERT_TRUE(c0.ok() && c1.ok());
  auto id = (*c0)->CreateCommId();
  ASSERT_TRUE(id.ok());
  std::unique_ptr<Client>* clients[2] = {&*c0, &*c1};
  EXPECT_EQ(GroupEnd().code(), absl::StatusCode::kFailedPrecondition);
  constexpr int kOps = 12, kCount = 16;
  std::vector<std::string> errors(2);
  std::atomic<uint64_t> fused{0};
  auto rank_main = [&](int rank) {
    Client& client = **clients[rank];
    auto comm = client.InitComm(*id, rank, 2);
    if (!comm.ok()) {
      errors[rank] = std::string(comm.status().message());
      return;
    }
    auto buf = client.Allocate(kOps * kCount * 8);
    if (!buf.ok()) return;
    for (int round = 0; round < 20; ++round) {
      auto* f = static_cast<float*>(buf->data());
      auto* d = static_cast<double*>(buf->data());
      for (int op = 0; op < kOps; ++op) {
        for (int k = 0; k < kCount / 2; ++k) {
          if (op < 8) {
            f[op * kCount + k] = static_cast<float>(rank * 100 + op * 10 + k + round);
          } else {
            d[op * kCount / 2 + k] = rank + op + k + round;
          }
        }
      }
      std::vector<Work> works;
      GroupStart();
      GroupStart();  // nested: only the outer GroupEnd submits
      for (int op = 0; op < kOps; ++op) {
        // 0-3: float sum, 4-7: float max, 8-11: double sum (each run of alike ones may fuse).
        const bool dbl = op >= 8;
        const size_t off = op * kCount * 4;  // 64 bytes per operation
        works.push_back(comm->AllReduce(BufferRef(*buf, off), BufferRef(*buf, off), kCount / 2,
                                        dbl ? DataType::kFloat64 : DataType::kFloat32,
                                        op >= 4 && op < 8 ? RedOp::kMax : RedOp::kSum));
      }
      (void)GroupEnd();
      if (!GroupEnd().ok()) errors[rank] = "outer GroupEnd failed";
      for (size_t i = 0; i < works.size(); ++i) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!works[i].test() && std::chrono::steady_clock::now() < until) {
          std::this_thread::yield();
        }
        absl::Status s = works[i].wait(std::chrono::seconds(1));
        if (!s.ok()) errors[rank] = std::string(s.message());
      }
      for (int op = 0; op < 8; ++op) {
        for (int k = 0; k < kCount / 2; ++k) {
          const float a = static_cast<float>(op * 10 + k + round);
          const float want = op < 4 ? a + (100 + a) : 100 + a;
          if (f[op * kCount + k] != want) errors[rank] = "float result wrong";
        }
      }
      for (int op = 8; op < kOps; ++op) {
        for (int k = 0; k < kCount / 2; ++k) {
          const double want = 2.0 * (op + k + round) + 1;
          if (d[op * kCount / 2 + k] != want) errors[rank] = "double result wrong";
        }
      }
    }
    if (rank == 0) {  // before it leaves: the communicator is still there
      const v1::StatusResponse st = daemon.Status();
      for (const auto& c : st.comms()) fused += c.ops_fused();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(daemon.Status().ops_failed(), 0u);
  EXPECT_GE(daemon.Status().ops_completed(), 20u * kOps);
  // Groups were fused where they could be: at least 3 executions per group of 12 (three runs of
  // alike operations), so at most 9 fused per group.
  EXPECT_GT(fused.load(), 0u);
  EXPECT_LE(fused.load(), 20u * (kOps - 3));
}

}  // namespace
}  // namespace railyard::testing
