// After a daemon crash (SIGKILL) and a new daemon on the same socket: exactly which operations
// run and which fail (docs/restarts.md, "A crash"). Two ranks of one communicator, one Client
// each; rank 0's collective is taken by the daemon (rank 1 has not submitted its copy yet, so
// it cannot run) when the daemon is killed.
#include <chrono>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "railyard/client.h"
#include "tests/integration/daemon_fixture.h"

namespace railyard::testing {
namespace {

using ::testing::HasSubstr;

constexpr size_t kCount = 1024;

struct Ranks {
  std::unique_ptr<Client> client[2];
  Buffer buf[2];
  Comm comm[2];
};

void Connect(DaemonProcess& daemon, Ranks* r) {
  for (int i = 0; i < 2; ++i) {
    auto c = Client::Connect(daemon.Options("crash"));
    ASSERT_TRUE(c.ok()) << c.status();
    r->client[i] = *std::move(c);
    auto b = r->client[i]->Allocate(2 * kCount * sizeof(float));
    ASSERT_TRUE(b.ok()) << b.status();
    r->buf[i] = *std::move(b);
  }
  auto id = r->client[0]->CreateCommId();
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<Comm> c1;
  std::thread t([&] { c1 = r->client[1]->InitComm(*id, 1, 2); });
  auto c0 = r->client[0]->InitComm(*id, 0, 2);
  t.join();
  ASSERT_TRUE(c0.ok() && c1.ok()) << c0.status() << " " << c1.status();
  r->comm[0] = *std::move(c0);
  r->comm[1] = *std::move(c1);
}

// Rank i's input: i + 1 everywhere (in the first half of its buffer).
void Fill(Ranks& r) {
  for (int i = 0; i < 2; ++i) {
    auto x = r.buf[i].span<float>();
    std::fill(x.begin(), x.end(), static_cast<float>(i + 1));
  }
}

Work AllReduce(Ranks& r, int i, bool in_place) {
  return r.comm[i].AllReduce(BufferRef(r.buf[i], 0),
                             BufferRef(r.buf[i], in_place ? 0 : kCount * sizeof(float)), kCount,
                             DataType::kFloat32, RedOp::kSum);
}

void ExpectSum(Ranks& r, bool in_place) {
  for (int i = 0; i < 2; ++i) {
    auto x = r.buf[i].span<float>();
    const size_t at = in_place ? 0 : kCount;
    for (size_t k = 0; k < kCount; ++k) ASSERT_EQ(x[at + k], 3.0f) << "rank " << i << " " << k;
  }
}

// One more AllReduce on both ranks: both complete, as the same collective, exactly.
void BothExact(Ranks& r, bool in_place) {
  Fill(r);
  Work a = AllReduce(r, 0, in_place);
  Work b = AllReduce(r, 1, in_place);
  ASSERT_TRUE(a.wait(std::chrono::seconds(30)).ok()) << a.wait();
  ASSERT_TRUE(b.wait(std::chrono::seconds(30)).ok()) << b.wait();
  ExpectSum(r, in_place);
  EXPECT_EQ(a.seq(), b.seq());
}

// The daemon took rank 0's collective (it waits in the communicator for rank 1's copy): kill it
// and start a new one on the same socket.
void CrashWithRankZerosCollectiveTaken(DaemonProcess& daemon) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  daemon.Kill();
  daemon.Start();
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
}

TEST(CrashTest, ATakenOutOfPlaceCollectiveRunsAgainOnTheNewDaemon) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready());
  Ranks r;
  ASSERT_NO_FATAL_FAILURE(Connect(daemon, &r));
  Fill(r);
  Work w0 = AllReduce(r, 0, /*in_place=*/false);
  ASSERT_NO_FATAL_FAILURE(CrashWithRankZerosCollectiveTaken(daemon));
  Work w1 = AllReduce(r, 1, false);
  ASSERT_TRUE(w0.wait(std::chrono::seconds(60)).ok()) << w0.wait();
  ASSERT_TRUE(w1.wait(std::chrono::seconds(60)).ok()) << w1.wait();
  ExpectSum(r, false);
  EXPECT_EQ(r.client[0]->reconnects(), 1u);
  EXPECT_EQ(r.client[1]->reconnects(), 1u);
  EXPECT_EQ(w0.seq(), w1.seq());  // the same collective on both ranks
}

TEST(CrashTest, ATakenInPlaceCollectiveFailsOnEveryRankAndTheCommunicatorGoesOn) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready());
  Ranks r;
  ASSERT_NO_FATAL_FAILURE(Connect(daemon, &r));
  Fill(r);
  // A first collective, completed: the restart comes in the middle of a communicator's life.
  Work first = AllReduce(r, 0, true);
  ASSERT_TRUE(AllReduce(r, 1, true).wait(std::chrono::seconds(30)).ok());
  ASSERT_TRUE(first.wait(std::chrono::seconds(30)).ok());
  Fill(r);
  Work w0 = AllReduce(r, 0, /*in_place=*/true);
  ASSERT_NO_FATAL_FAILURE(CrashWithRankZerosCollectiveTaken(daemon));
  // Rank 0's copy may have been overwritten: it fails, naming the restart.
  absl::Status s0 = w0.wait(std::chrono::seconds(60));
  EXPECT_EQ(s0.code(), absl::StatusCode::kUnavailable) << s0;
  EXPECT_THAT(s0.message(), HasSubstr("restarted during this"));
  // Rank 1's copy, submitted after the restart, fails too: the other rank's is gone.
  absl::Status s1 = AllReduce(r, 1, true).wait(std::chrono::seconds(60));
  EXPECT_EQ(s1.code(), absl::StatusCode::kUnavailable) << s1;
  EXPECT_THAT(s1.message(), HasSubstr("on another rank"));
  // And the communicator goes on, exact.
  ASSERT_NO_FATAL_FAILURE(BothExact(r, true));
}

TEST(CrashTest, ATakenSendFailsAndIsNotSentTwice) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready());
  Ranks r;
  ASSERT_NO_FATAL_FAILURE(Connect(daemon, &r));
  Fill(r);
  Work send = r.comm[0].Send(BufferRef(r.buf[0], 0), kCount, DataType::kFloat32, 1);
  ASSERT_NO_FATAL_FAILURE(CrashWithRankZerosCollectiveTaken(daemon));
  absl::Status s = send.wait(std::chrono::seconds(60));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("restarted during this"));
  // Collectives go on.
  ASSERT_NO_FATAL_FAILURE(BothExact(r, false));
}

TEST(CrashTest, WithoutAReconnectWindowTheSessionEndsWithTheDaemon) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready());
  ASSERT_EQ(::setenv("RAILYARD_RECONNECT_S", "0", 1), 0);
  auto c = Client::Connect(daemon.Options("crash0"));
  ::unsetenv("RAILYARD_RECONNECT_S");
  ASSERT_TRUE(c.ok()) << c.status();
  auto b = (*c)->Allocate(64);
  ASSERT_TRUE(b.ok()) << b.status();
  auto id = (*c)->CreateCommId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto comm = (*c)->InitComm(*id, 0, 1);
  ASSERT_TRUE(comm.ok()) << comm.status();
  daemon.Kill();
  daemon.Start();
  // The session ended with the daemon: the operation fails, and never runs on the new one.
  absl::Status s =
      comm->AllReduce(*b, *b, 16, DataType::kFloat32, RedOp::kSum).wait(std::chrono::seconds(20));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ((*c)->reconnects(), 0u);
}

TEST(CrashTest, ABadReconnectWindowIsRefusedAtConnect) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready());
  for (const char* bad : {"-1", "soon", "90000", "5s"}) {
    ASSERT_EQ(::setenv("RAILYARD_RECONNECT_S", bad, 1), 0);
    auto c = Client::Connect(daemon.Options("crashbad"));
    ::unsetenv("RAILYARD_RECONNECT_S");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(c.status().message(), HasSubstr("RAILYARD_RECONNECT_S")) << bad;
  }
}

}  // namespace
}  // namespace railyard::testing
