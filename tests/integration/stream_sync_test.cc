// Stream ordering (docs/gpu.md, "Stream ordering") through a real railyardd and the real C++
// client, on hosts without a GPU: streams are FakeStreams (tests/integration/fake_device_memory.h),
// which run their work in order on a thread as a CUDA stream does on the device, and device
// buffers are the daemon's --fake_gpus memfds. An operation given a stream must read what the
// stream's earlier work wrote and be seen by its later work, with no Work::wait() between; held
// operations keep their order; a stream that never comes, bad words, refusals and a session that
// ends with operations held each end as they say, with the stream let go and the daemon serving.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/fake_device_memory.h"
#include "tests/integration/process.h"
#include "tests/integration/virtual_cluster.h"

namespace railyard::testing {
namespace {

using ::testing::HasSubstr;

std::string Check(const absl::Status& s, const std::string& what) {
  return s.ok() ? std::string() : what + ": " + s.ToString();
}

// Waits (bounded) until `flag` is set: a producer held back until the host has submitted.
void AwaitFlag(const std::atomic<bool>& flag) {
  for (int i = 0; i < 30000 && !flag.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

uint32_t Load(const Buffer& b, uint64_t offset) {
  return __atomic_load_n(reinterpret_cast<uint32_t*>(static_cast<std::byte*>(b.data()) + offset),
                         __ATOMIC_ACQUIRE);
}

void Store(const Buffer& b, uint64_t offset, uint32_t v) {
  __atomic_store_n(reinterpret_cast<uint32_t*>(static_cast<std::byte*>(b.data()) + offset), v,
                   __ATOMIC_RELEASE);
}

// One client per options (each a rank's session), and a communicator id the first made.
struct Ranks {
  std::vector<std::unique_ptr<Client>> clients;
  std::string comm_id;
};

absl::StatusOr<Ranks> ConnectRanks(const std::vector<ClientOptions>& options) {
  Ranks out;
  for (const ClientOptions& o : options) {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
    if (!c.ok()) return c.status();
    out.clients.push_back(*std::move(c));
  }
  absl::StatusOr<std::string> id = out.clients[0]->CreateCommId();
  if (!id.ok()) return id.status();
  out.comm_id = *id;
  return out;
}

// Options for a rank whose streams are FakeStreams.
ClientOptions WithStreams(ClientOptions o, std::shared_ptr<StreamOps> ops) {
  o.stream_ops = std::move(ops);
  return o;
}

// One rank's part of StreamOrderTest: three AllReduces on its stream, each between a producer
// that writes the input and a consumer that copies the result out. The first producer waits until
// the host has submitted all three, so any operation that ran before its stream reached it would
// read stale input, and any consumer that ran early would copy a stale result.
std::string ThreeOrderedAllReduces(Client& client, Comm& comm, int rank, int nranks) {
  constexpr size_t kCount = 4099;
  FakeDeviceMemory send(0, kCount * 4), recv(0, kCount * 4);
  auto sb = client.RegisterDeviceMemory(send.fd, send.bytes, 0, send.view);
  auto rb = client.RegisterDeviceMemory(recv.fd, recv.bytes, 0, recv.view);
  if (!sb.ok() || !rb.ok()) return "register failed";
  std::atomic<bool> go{false};
  std::vector<std::vector<float>> seen(3);
  FakeStream stream;  // after what its work uses: it drains its queue before they go
  struct Release {
    std::atomic<bool>& go;
    ~Release() { go = true; }  // an early return lets the first producer finish
  } release{go};
  std::vector<Work> works;
  for (int k = 0; k < 3; ++k) {
    stream.Enqueue([&, k] {
      if (k == 0) AwaitFlag(go);
      for (size_t i = 0; i < kCount; ++i) {
        send.f()[i] = static_cast<float>((rank + 1) * (k + 1) * static_cast<int>(i % 7));
      }
    });
    CollectiveOptions o;
    o.stream = &stream;
    works.push_back(comm.AllReduce(*sb, *rb, kCount, DataType::kFloat32, RedOp::kSum, o));
    stream.Enqueue([&, k] { seen[k].assign(recv.f(), recv.f() + kCount); });
  }
  // The host did not wait for the stream: nothing can have run yet.
  for (const Work& w : works) {
    if (w.test()) return "an operation completed before its stream reached it";
  }
  go = true;
  if (!stream.Synchronize()) return "the stream did not finish";
  const float ranks = nranks * (nranks + 1) / 2.0f;
  for (int k = 0; k < 3; ++k) {
    for (size_t i = 0; i < kCount; ++i) {
      const float want = ranks * static_cast<float>((k + 1) * static_cast<int>(i % 7));
      if (seen[k][i] != want) {
        return "operation " + std::to_string(k) + " element " + std::to_string(i) + ": " +
               std::to_string(seen[k][i]) + ", expected " + std::to_string(want);
      }
    }
  }
  for (Work& w : works) {
    if (auto e = Check(w.wait(std::chrono::seconds(10)), "wait"); !e.empty()) return e;
  }
  return "";
}

class StreamOrderTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { setenv("RAILYARD_FASTPATH", GetParam() ? "1" : "0", 1); }
  void TearDown() override { unsetenv("RAILYARD_FASTPATH"); }
};

TEST_P(StreamOrderTest, AnOperationOnAStreamRunsAfterTheStreamsWorkAndBeforeWhatFollowsIt) {
  DaemonProcess daemon({"--fake_gpus=1"});
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  auto ops = std::make_shared<FakeStreamOps>();
  constexpr int kRanks = 2;
  absl::StatusOr<Ranks> ranks =
      ConnectRanks({WithStreams(daemon.Options(), ops), WithStreams(daemon.Options(), ops)});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<Client>>& clients = ranks->clients;
  const std::string* id = &ranks->comm_id;
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto comm = clients[r]->InitComm(*id, r, kRanks);
      if (!comm.ok()) {
        errors[r] = comm.status().ToString();
        return;
      }
      errors[r] = ThreeOrderedAllReduces(*clients[r], *comm, r, kRanks);
      if (errors[r].empty()) errors[r] = Check(comm->Barrier().wait(), "closing barrier");
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << "\n" << daemon.Log();
  EXPECT_EQ(ops->mapped.load(), kRanks);  // one words buffer per client, mapped once
  EXPECT_EQ(daemon.Status().ops_failed(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Paths, StreamOrderTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "rings" : "grpc"; });

// Across nodes the device memory is staged through host memory: the copy must wait for the
// stream too.
TEST(StreamSyncTest, AcrossNodesTheStagingCopyWaitsForTheStream) {
  VirtualCluster cluster(2, {"--fake_gpus=1"}, PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  auto ops = std::make_shared<FakeStreamOps>();
  absl::StatusOr<Ranks> ranks = ConnectRanks(
      {WithStreams(cluster[0].Options(), ops), WithStreams(cluster[1].Options(), ops)});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<Client>>& clients = ranks->clients;
  const std::string* id = &ranks->comm_id;
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm = clients[r]->InitComm(*id, r, 2);
      if (!comm.ok()) {
        errors[r] = comm.status().ToString();
        return;
      }
      if (comm->nnodes() != 2) {
        errors[r] = "not across two nodes";
        return;
      }
      errors[r] = ThreeOrderedAllReduces(*clients[r], *comm, r, 2);
      if (errors[r].empty()) errors[r] = Check(comm->Barrier().wait(), "closing barrier");
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << "\n" << cluster.Logs();
}

// A one-rank communicator on a daemon with a fake GPU, for the cases one rank can show.
struct OneRank {
  explicit OneRank(const DaemonProcess& daemon) {
    auto c = Client::Connect(daemon.Options());
    EXPECT_TRUE(c.ok()) << c.status();
    client = *std::move(c);
    auto id = client->CreateCommId();
    EXPECT_TRUE(id.ok());
    auto cm = client->InitComm(*id, 0, 1);
    EXPECT_TRUE(cm.ok()) << cm.status();
    comm = *std::move(cm);
  }
  std::unique_ptr<Client> client;
  Comm comm;
};

TEST(StreamSyncTest, BadWordsAreRefusedSayingWhyAndARefusedOperationLetsItsStreamGo) {
  DaemonProcess daemon({"--fake_gpus=1"});
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  OneRank one(daemon);
  auto data = one.client->Allocate(64);
  auto words = one.client->Allocate(4096);
  ASSERT_TRUE(data.ok() && words.ok());
  FakeDeviceMemory dev(0, 4096);
  auto dev_words = one.client->RegisterDeviceMemory(dev.fd, 4096, 0, dev.view);
  ASSERT_TRUE(dev_words.ok()) << dev_words.status();
  auto run = [&](const Buffer* w, uint64_t offset, uint32_t value, size_t count = 4) {
    CollectiveOptions o;
    o.stream_sync = CollectiveOptions::StreamSync{w, offset, value};
    o.timeout = std::chrono::seconds(5);
    return one.comm.AllReduce(*data, *data, count, DataType::kFloat32, RedOp::kSum, o)
        .wait(std::chrono::seconds(10));
  };
  struct Case {
    const Buffer* words;
    uint64_t offset;
    const char* says;
  } const cases[] = {
      {&*dev_words, 0, "is memory of device 0; the ready and done words must be host memory"},
      {&*words, 2, "offset 2 in the 4096-byte buffer"},
      {&*words, 4092, "offset 4092 in the 4096-byte buffer"},
      {&*words, uint64_t{1} << 63, "offset 9223372036854775808 in the 4096-byte buffer"},
  };
  for (const Case& c : cases) {
    absl::Status s = run(c.words, c.offset, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("stream_sync.words"));
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.says));
  }
  // Words of another client, and both forms at once: refused by the client.
  auto other = Client::Connect(daemon.Options());
  ASSERT_TRUE(other.ok());
  auto foreign = (*other)->Allocate(4096);
  ASSERT_TRUE(foreign.ok());
  absl::Status s = run(&*foreign, 0, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("belongs to another Client"));
  FakeStream stream;
  CollectiveOptions both;
  both.stream = &stream;
  both.stream_sync = CollectiveOptions::StreamSync{&*words, 0, 1};
  s = one.comm.AllReduce(*data, *data, 4, DataType::kFloat32, RedOp::kSum, both).wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("set stream or stream_sync, not both"));

  // Sound words, an operation the daemon refuses (more elements than the buffer holds): done is
  // stored, so a stream waiting on it goes on.
  s = run(&*words, 64, 5, /*count=*/1000);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(Load(*words, 68), 5u);
  // And one that runs: ready already there, done stored, the result right.
  Store(*words, 128, 7);
  static_cast<float*>(data->data())[0] = 2.5f;
  EXPECT_TRUE(run(&*words, 128, 7).ok());
  EXPECT_EQ(Load(*words, 132), 7u);
  EXPECT_EQ(static_cast<float*>(data->data())[0], 2.5f);
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

// Held operations keep their order: rank 0's first operation waits for its stream, its second
// has none; rank 1 submits both at once. Were rank 0's second to pass its first, the two would be
// matched against rank 1's first (other counts: INVALID_ARGUMENT).
TEST(StreamSyncTest, AnOperationBehindAHeldOneWaitsForIt) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  absl::StatusOr<Ranks> ranks = ConnectRanks({daemon.Options(), daemon.Options()});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<Client>>& clients = ranks->clients;
  const std::string* id = &ranks->comm_id;
  std::vector<std::string> errors(2);
  std::atomic<bool> submitted{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      errors[r] = [&]() -> std::string {
        auto comm = clients[r]->InitComm(*id, r, 2);
        if (!comm.ok()) return comm.status().ToString();
        auto a = clients[r]->Allocate(16 * 4), b = clients[r]->Allocate(32 * 4);
        auto words = clients[r]->Allocate(64);
        if (!a.ok() || !b.ok() || !words.ok()) return "allocate failed";
        static_cast<float*>(a->data())[15] = 1.0f + r;
        static_cast<float*>(b->data())[31] = 10.0f + r;
        CollectiveOptions first;
        if (r == 0) first.stream_sync = CollectiveOptions::StreamSync{&*words, 8, 1};
        Work wa = comm->AllReduce(*a, *a, 16, DataType::kFloat32, RedOp::kSum, first);
        Work wb = comm->AllReduce(*b, *b, 32, DataType::kFloat32, RedOp::kSum);
        if (r == 0) {
          submitted = true;
          // Both wait: the first for its stream, the second behind it.
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          if (wa.test() || wb.test()) return "ran before the stream reached it";
          Store(*words, 8, 1);  // the stream gets there
        }
        if (auto e = Check(wa.wait(std::chrono::seconds(20)), "first"); !e.empty()) return e;
        if (auto e = Check(wb.wait(std::chrono::seconds(20)), "second"); !e.empty()) return e;
        if (static_cast<float*>(a->data())[15] != 3.0f) return "first value wrong";
        if (static_cast<float*>(b->data())[31] != 21.0f) return "second value wrong";
        if (r == 0 && Load(*words, 12) != 1u) return "done not stored";
        return Check(comm->Barrier().wait(), "closing barrier");
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << "\n" << daemon.Log();
  EXPECT_TRUE(submitted.load());
}

// A stream that never reaches its operation: the operation fails at its timeout saying what the
// ready word holds, its stream is let go (done stored), the rank waiting for it times out as any
// rank does, and another job on the daemon runs meanwhile at its own pace.
TEST(StreamSyncTest, AStreamThatNeverComesTimesOutLetsItsStreamGoAndHoldsNoOneElse) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  absl::StatusOr<Ranks> ranks = ConnectRanks({daemon.Options(), daemon.Options()});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<Client>>& clients = ranks->clients;
  const std::string* id = &ranks->comm_id;
  std::vector<absl::Status> got(2);
  std::vector<uint32_t> done(2, 0);
  std::atomic<int> ended{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm = clients[r]->InitComm(*id, r, 2);
      if (!comm.ok()) {
        got[r] = comm.status();
        return;
      }
      auto a = clients[r]->Allocate(64);
      auto words = clients[r]->Allocate(64);
      if (!a.ok() || !words.ok()) return;
      Store(*words, 0, 41);
      CollectiveOptions o;
      o.timeout = std::chrono::milliseconds(600);
      if (r == 0) o.stream_sync = CollectiveOptions::StreamSync{&*words, 0, 42};
      got[r] = comm->AllReduce(*a, *a, 4, DataType::kFloat32, RedOp::kSum, o)
                   .wait(std::chrono::seconds(20));
      done[r] = Load(*words, 4);
      // Leaving aborts the communicator for a rank still waiting (docs/local-api.md): rank 0's
      // expiry and rank 1's deadline come at about the same time, so both stay until both ended.
      ++ended;
      for (int i = 0; i < 20000 && ended.load() < 2; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  // Another job, meanwhile: 50 AllReduces of its own.
  std::string other_error;
  // (No ASSERT here: the stuck ranks' threads are running.)
  absl::StatusOr<Ranks> other = ConnectRanks({daemon.Options("other"), daemon.Options("other")});
  if (!other.ok()) {
    other_error = other.status().ToString();
  } else {
    std::vector<std::thread> others;
    std::vector<std::string> oerr(2);
    for (int r = 0; r < 2; ++r) {
      others.emplace_back([&, r] {
        oerr[r] = [&]() -> std::string {
          Client& client = *other->clients[r];
          auto comm = client.InitComm(other->comm_id, r, 2);
          if (!comm.ok()) return comm.status().ToString();
          auto b = client.Allocate(64);
          if (!b.ok()) return "allocate";
          for (int i = 0; i < 50; ++i) {
            static_cast<float*>(b->data())[0] = 1.0f;
            absl::Status s = comm->AllReduce(*b, *b, 1, DataType::kFloat32, RedOp::kSum)
                                 .wait(std::chrono::seconds(10));
            if (!s.ok()) return s.ToString();
            if (static_cast<float*>(b->data())[0] != 2.0f) return "value";
          }
          return Check(comm->Barrier().wait(), "closing barrier");
        }();
      });
    }
    for (auto& t : others) t.join();
    other_error = oerr[0] + oerr[1];
  }
  EXPECT_EQ(other_error, "");
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[0].code(), absl::StatusCode::kDeadlineExceeded) << got[0];
  EXPECT_THAT(std::string(got[0].message()),
              HasSubstr("the stream did not reach the operation within its timeout: the ready "
                        "word (buffer "));
  EXPECT_THAT(std::string(got[0].message()), HasSubstr("holds 41, the operation waits for 42"));
  EXPECT_EQ(done[0], 42u);
  EXPECT_EQ(got[1].code(), absl::StatusCode::kDeadlineExceeded) << got[1];
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

// A session that ends, or a communicator destroyed, with operations held: they go with it; the
// daemon serves the next client.
TEST(StreamSyncTest, ASessionEndingWithHeldOperationsLeavesTheDaemonServing) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  {
    OneRank one(daemon);
    auto a = one.client->Allocate(64);
    auto words = one.client->Allocate(64);
    ASSERT_TRUE(a.ok() && words.ok());
    CollectiveOptions o;
    o.stream_sync = CollectiveOptions::StreamSync{&*words, 0, 1};
    for (int i = 0; i < 5; ++i) {
      Work w = one.comm.AllReduce(*a, *a, 4, DataType::kFloat32, RedOp::kSum, o);
      EXPECT_FALSE(w.test());
    }
    // Operators see them waiting (once the daemon has taken the five ring entries).
    for (int i = 0; i < 1000 && daemon.Status().ops_held_for_streams() < 5; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(daemon.Status().ops_held_for_streams(), 5u);
  }
  for (int i = 0; i < 1000 && daemon.Status().ops_held_for_streams() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(daemon.Status().ops_held_for_streams(), 0u);
  // A communicator destroyed with operations held: they end CANCELLED, their stream let go.
  {
    OneRank one(daemon);
    auto a = one.client->Allocate(64);
    auto words = one.client->Allocate(64);
    ASSERT_TRUE(a.ok() && words.ok());
    CollectiveOptions o;
    o.stream_sync = CollectiveOptions::StreamSync{&*words, 0, 1};
    Work w = one.comm.AllReduce(*a, *a, 4, DataType::kFloat32, RedOp::kSum, o);
    // (The ring entry and the DestroyComm call take different ways in: wait until it is held.)
    for (int i = 0; i < 1000 && daemon.Status().ops_held_for_streams() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(one.comm.Destroy().ok());
    const absl::Status s = w.wait(std::chrono::seconds(10));
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 destroyed communicator"));
    EXPECT_EQ(Load(*words, 4), 1u);
    EXPECT_EQ(daemon.Status().ops_held_for_streams(), 0u);
  }
  OneRank next(daemon);
  auto a = next.client->Allocate(64);
  ASSERT_TRUE(a.ok());
  static_cast<float*>(a->data())[0] = 4.0f;
  EXPECT_TRUE(next.comm.AllReduce(*a, *a, 4, DataType::kFloat32, RedOp::kSum).wait().ok());
  EXPECT_EQ(static_cast<float*>(a->data())[0], 4.0f);
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

// railyard-perf --stream_sync: every operation ordered on a "stream" the rank opens right after
// submitting, over both collective shapes with a data check.
TEST(StreamSyncTest, RailyardPerfWithStreamSyncChecksItsData) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  for (const char* op : {"allreduce", "sendrecv"}) {
    Process perf({PERF_PATH,
                  "--op",
                  op,
                  "-b",
                  "8",
                  "-e",
                  "256K",
                  "-f",
                  "64",
                  "-n",
                  "20",
                  "-w",
                  "2",
                  "-c",
                  "2",
                  "--daemons",
                  daemon.socket(),
                  "--ranks-per-daemon",
                  "2",
                  "--job",
                  "itest",
                  "--stream_sync"},
                 daemon.dir() + "/perf-" + op + ".log");
    auto code = perf.Wait(std::chrono::seconds(120));
    ASSERT_TRUE(code.has_value()) << op << " hung";
    EXPECT_EQ(*code, 0) << op << ":\n" << perf.Output();
    EXPECT_THAT(perf.Output(), HasSubstr("# Avg bus bandwidth")) << op;
  }
  EXPECT_EQ(daemon.Status().ops_failed(), 0u);
  EXPECT_EQ(daemon.Status().ops_held_for_streams(), 0u);
}

}  // namespace
}  // namespace railyard::testing
