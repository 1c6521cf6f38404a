// Device buffers through a real railyardd and the real C++ client, on hosts without a GPU: the
// daemon runs with --fake_gpus (daemon/device/fake_device_runtime.h), whose "device allocations"
// are memfds named railyard-fake-device-<N> and whose device addresses fault if the daemon's host
// code ever touched them. Ranks are threads, one session each. Every collective on device buffers
// is checked value by value; every refusal (no devices, wrong device, too large, not device
// memory, host and device mixed in one operation or across ranks) by its code and text, with the
// daemon serving host memory after them. The same path on a real GPU: tests/cuda.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/device/fake_device_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_ranks.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/fake_device_memory.h"
#include "tests/integration/virtual_cluster.h"

namespace railyard::testing {
namespace {

using ::testing::HasSubstr;

std::string Check(const absl::Status& s, const char* what) {
  return s.ok() ? std::string() : std::string(what) + ": " + std::string(s.message());
}

// Runs fn(rank, client, comm) on nranks threads, one session each (rank r's with options_of(r)),
// in one communicator; returns their errors. Unless told the communicator ends aborted, the
// ranks then meet in a Barrier before they leave.
enum class Ending { kMeet, kAborted };
std::vector<std::string> RunRanks(const std::function<ClientOptions(int)>& options_of, int nranks,
                                  const std::function<std::string(int, Client&, Comm&)>& fn,
                                  Ending ending = Ending::kMeet) {
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::string> errors(nranks);
  for (int r = 0; r < nranks; ++r) {
    auto c = Client::Connect(options_of(r));
    if (!c.ok()) return {std::string(c.status().message())};
    clients.push_back(*std::move(c));
  }
  auto id = clients[0]->CreateCommId();
  if (!id.ok()) return {std::string(id.status().message())};
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      auto comm = clients[r]->InitComm(*id, r, nranks);
      if (!comm.ok()) {
        errors[r] = std::string(comm.status().message());
        return;
      }
      errors[r] = fn(r, *clients[r], *comm);
      // A rank that destroys its communicator while another still has a Send or Recv in flight
      // aborts it for everyone (docs/local-api.md), so the ranks meet before they leave.
      if (errors[r].empty() && ending == Ending::kMeet) {
        errors[r] = Check(comm->Barrier().wait(), "closing barrier");
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Every rank a session of one daemon.
std::vector<std::string> RunRanks(const DaemonProcess& daemon, int nranks,
                                  const std::function<std::string(int, Client&, Comm&)>& fn,
                                  Ending ending = Ending::kMeet) {
  return RunRanks([&](int) { return daemon.Options(); }, nranks, fn, ending);
}

// Rank r a session of node r / per_node of the cluster.
std::vector<std::string> RunRanks(VirtualCluster& cluster, int per_node, int nranks,
                                  const std::function<std::string(int, Client&, Comm&)>& fn) {
  return RunRanks([&](int r) { return cluster[r / per_node].Options(); }, nranks, fn);
}

// Every rank on device 1, or (the usual node: a GPU per rank) rank r on device r % 2, the two
// devices reaching each other's memory as NVLink peers do.
class DeviceLayoutTest : public ::testing::TestWithParam<bool> {};

TEST_P(DeviceLayoutTest, EveryCollectiveOnDeviceBuffersIsExact) {
  DaemonProcess daemon({"--fake_gpus=2"});
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  constexpr int kRanks = 3;
  constexpr size_t kCount = 300001;  // odd, and larger than --inline_max_bytes
  const bool spread = GetParam();
  const std::vector<std::string> errors =
      RunRanks(daemon, kRanks, [&](int rank, Client& client, Comm& comm) -> std::string {
        const int dev = spread ? rank % 2 : 1;
        FakeDeviceMemory send(dev, kCount * kRanks * 4), recv(dev, kCount * kRanks * 4);
        auto sb = client.RegisterDeviceMemory(send.fd, send.bytes, dev, send.view);
        auto rb = client.RegisterDeviceMemory(recv.fd, recv.bytes, dev, recv.view);
        if (!sb.ok() || !rb.ok())
          return "register: " + std::string((sb.ok() ? rb : sb).status().message());
        if (sb->device() != dev || sb->data() != send.view) return "buffer says the wrong device";
        const float me = static_cast<float>(rank + 1);
        for (size_t i = 0; i < kCount * kRanks; ++i) send.f()[i] = me * static_cast<float>(i % 97);
        // AllReduce, out of place: sum over ranks of (r + 1) * (i % 97) = 6 * (i % 97).
        if (auto e = Check(comm.AllReduce(*sb, *rb, kCount, DataType::kFloat32, RedOp::kSum).wait(),
                           "allreduce");
            !e.empty()) {
          return e;
        }
        for (size_t i = 0; i < kCount; ++i) {
          if (recv.f()[i] != 6.0f * static_cast<float>(i % 97)) return "allreduce value wrong";
        }
        // In place, avg: (1 + 2 + 3) / 3 * (i % 97).
        if (auto e = Check(comm.AllReduce(*sb, *sb, kCount, DataType::kFloat32, RedOp::kAvg).wait(),
                           "allreduce in place");
            !e.empty()) {
          return e;
        }
        for (size_t i = 0; i < kCount; ++i) {
          if (send.f()[i] != 2.0f * static_cast<float>(i % 97)) return "avg value wrong";
        }
        // Broadcast from rank 2, small (runs inline for host memory; on a worker for device).
        for (size_t i = 0; i < 16; ++i) send.f()[i] = rank == 2 ? 42.0f + i : -1.0f;
        if (auto e = Check(comm.Broadcast(*sb, *rb, 16, DataType::kFloat32, 2).wait(), "bcast");
            !e.empty()) {
          return e;
        }
        for (size_t i = 0; i < 16; ++i) {
          if (recv.f()[i] != 42.0f + i) return "broadcast value wrong";
        }
        // AllGather: block r of recv is rank r's send.
        for (size_t i = 0; i < kCount; ++i) send.f()[i] = me + static_cast<float>(i % 5);
        if (auto e =
                Check(comm.AllGather(*sb, *rb, kCount, DataType::kFloat32).wait(), "allgather");
            !e.empty()) {
          return e;
        }
        for (int r = 0; r < kRanks; ++r) {
          for (size_t i = 0; i < kCount; i += 7) {
            if (recv.f()[r * kCount + i] != r + 1 + static_cast<float>(i % 5)) {
              return "allgather value wrong";
            }
          }
        }
        // ReduceScatter max: block r of every rank's send is (rank + 1) * 10 + r.
        for (int r = 0; r < kRanks; ++r) {
          for (size_t i = 0; i < kCount; ++i) send.f()[r * kCount + i] = me * 10 + r;
        }
        if (auto e = Check(
                comm.ReduceScatter(*sb, *rb, kCount, DataType::kFloat32, RedOp::kMax).wait(), "rs");
            !e.empty()) {
          return e;
        }
        for (size_t i = 0; i < kCount; i += 11) {
          if (recv.f()[i] != 30.0f + rank) return "reducescatter value wrong";
        }
        // AllToAll: rank s sends block d = s * 100 + d to rank d.
        for (int d = 0; d < kRanks; ++d) {
          for (size_t i = 0; i < kCount; ++i) send.f()[d * kCount + i] = rank * 100.0f + d;
        }
        if (auto e = Check(comm.AllToAll(*sb, *rb, kCount, DataType::kFloat32).wait(), "a2a");
            !e.empty()) {
          return e;
        }
        for (int s = 0; s < kRanks; ++s) {
          if (recv.f()[s * kCount + 3] != s * 100.0f + rank) return "alltoall value wrong";
        }
        // Send/Recv around the ring.
        for (size_t i = 0; i < kCount; ++i) send.f()[i] = me * 1000 + static_cast<float>(i % 13);
        Work sw = comm.Send(*sb, kCount, DataType::kFloat32, (rank + 1) % kRanks);
        Work rw = comm.Recv(*rb, kCount, DataType::kFloat32, (rank + kRanks - 1) % kRanks);
        if (auto e = Check(sw.wait(), "send"); !e.empty()) return e;
        if (auto e = Check(rw.wait(), "recv"); !e.empty()) return e;
        const float from = static_cast<float>((rank + kRanks - 1) % kRanks + 1);
        for (size_t i = 0; i < kCount; i += 3) {
          if (recv.f()[i] != from * 1000 + static_cast<float>(i % 13)) return "recv value wrong";
        }
        return "";
      });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  const v1::StatusResponse st = daemon.Status();
  EXPECT_EQ(st.ops_failed(), 0u);
  EXPECT_EQ(st.buffers(), 0u);  // the sessions are gone, and their device mappings with them
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

INSTANTIATE_TEST_SUITE_P(DeviceMemory, DeviceLayoutTest, ::testing::Values(false, true),
                         [](const auto& info) {
                           return info.param ? "RankPerDevice" : "OneDevice";
                         });

TEST(DeviceMemoryTest, ADaemonWithoutDevicesSaysWhy) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  auto client = Client::Connect(daemon.Options());
  ASSERT_TRUE(client.ok()) << client.status();
  FakeDeviceMemory mem(0, 4096);
  auto b = (*client)->RegisterDeviceMemory(mem.fd, 4096, 0, mem.view);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("serves no device memory"));
  // Operators see the same reason.
  EXPECT_THAT(daemon.Status().devices(), HasSubstr("host memory only"));
  // The client's own allocator says why too (no driver here, or no CUDA in this build).
  auto d = (*client)->AllocateDevice(4096, 0);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(d.status().code() == absl::StatusCode::kFailedPrecondition ||
              d.status().code() == absl::StatusCode::kInvalidArgument)
      << d.status();
  auto h = (*client)->Allocate(4096);
  EXPECT_TRUE(h.ok()) << h.status();
}

TEST(DeviceMemoryTest, BadDeviceMemoryIsRefusedSayingWhatIsWrong) {
  DaemonProcess daemon({"--fake_gpus=2"});
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  auto client = Client::Connect(daemon.Options());
  ASSERT_TRUE(client.ok()) << client.status();
  Client& c = **client;
  FakeDeviceMemory on1(1, 4096);
  auto expect_refused = [&](int fd, size_t size, int device, const std::string& text) {
    auto b = c.RegisterDeviceMemory(fd, size, device, on1.view);
    ASSERT_FALSE(b.ok()) << text;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
    EXPECT_THAT(std::string(b.status().message()), HasSubstr(text));
  };
  expect_refused(on1.fd, 4096, 5, "device 5 is not one of the 2 devices");
  expect_refused(on1.fd, 4096, 0, "lives on device 1, not on device 0");
  expect_refused(on1.fd, 4097, 1, "4097 bytes does not fit the exported allocation of 4096");
  const int plain = ::memfd_create("host-memory", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(plain, 4096), 0);
  expect_refused(plain, 4096, 1, "not an exported device allocation");
  ::close(plain);
  // Nothing was kept of them.
  EXPECT_EQ(daemon.Status().buffers(), 0u);
  EXPECT_THAT(daemon.Status().devices(), HasSubstr("2 device(s)"));
  auto good = c.RegisterDeviceMemory(on1.fd, 4096, 1, on1.view);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(daemon.Status().buffers(), 1u);
}

// Legacy CUDA IPC, the fallback for memory that is not a VMM allocation, on the fake runtime
// (whose handles name the process and descriptor that made them): taken only with --cuda_ipc,
// a buffer may start anywhere in its allocation, and ranks registered either way run together.
TEST(DeviceMemoryTest, CudaIpcHandlesRegisterDeviceMemoryOnlyWhereTheOperatorAllowsThem) {
  {
    DaemonProcess strict({"--fake_gpus=1"});
    ASSERT_TRUE(strict.ready()) << strict.Log();
    auto client = Client::Connect(strict.Options());
    ASSERT_TRUE(client.ok()) << client.status();
    FakeDeviceMemory mem(0, 4096);
    auto b = (*client)->RegisterCudaIpcMemory(*device::FakeDeviceRuntime::ExportIpc(mem.fd), 0,
                                              4096, 0, mem.view);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("--cuda_ipc is off"));
    EXPECT_EQ(strict.Status().buffers(), 0u);
    // Without a usable CUDA driver a device pointer cannot be exported at all.
    int dummy = 0;
    auto p = (*client)->RegisterDevicePointer(&dummy, sizeof(dummy), 0);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition) << p.status();
  }
  DaemonProcess daemon({"--fake_gpus=1", "--cuda_ipc"});
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  constexpr size_t kCount = 3000;
  constexpr uint64_t kOffset = 4100;  // not page-aligned
  const std::vector<std::string> errors =
      RunRanks(daemon, 2, [&](int rank, Client& client, Comm& comm) -> std::string {
        FakeDeviceMemory mem(0, kOffset + 2 * kCount * 4);
        auto* at = reinterpret_cast<float*>(static_cast<std::byte*>(mem.view) + kOffset);
        absl::StatusOr<Buffer> b;
        if (rank == 0) {
          const std::string handle = *device::FakeDeviceRuntime::ExportIpc(mem.fd);
          // Bad handles first: each refused saying why, nothing kept.
          auto bad = client.RegisterCudaIpcMemory(handle.substr(1), kOffset, kCount * 4, 0, at);
          if (bad.ok() || bad.status().code() != absl::StatusCode::kInvalidArgument ||
              bad.status().message().find("64 bytes, not 63") == std::string::npos) {
            return "short handle: " + bad.status().ToString();
          }
          bad = client.RegisterCudaIpcMemory(handle, mem.bytes - 4, kCount * 4, 0, at);
          if (bad.ok() || bad.status().code() != absl::StatusCode::kInvalidArgument ||
              bad.status().message().find("does not fit") == std::string::npos) {
            return "past the allocation: " + bad.status().ToString();
          }
          b = client.RegisterCudaIpcMemory(handle, kOffset, 2 * kCount * 4, 0, at);
        } else {
          b = client.RegisterDeviceMemory(mem.fd, mem.bytes, 0, mem.view);
          at = mem.f();
        }
        if (!b.ok()) return "register: " + b.status().ToString();
        for (size_t i = 0; i < kCount; ++i) at[i] = (rank + 1.0f) * static_cast<float>(i % 7);
        Work w = comm.AllReduce(BufferRef(*b, 0), BufferRef(*b, kCount * 4), kCount,
                                DataType::kFloat32, RedOp::kSum);
        if (absl::Status s = w.wait(); !s.ok()) return "allreduce: " + s.ToString();
        for (size_t i = 0; i < kCount; ++i) {
          if (at[kCount + i] != 3.0f * static_cast<float>(i % 7)) {
            return "value " + std::to_string(i) + " is " + std::to_string(at[kCount + i]);
          }
        }
        // The bytes before the registered range (rank 0's first kOffset) are not the buffer's.
        if (rank == 0 && mem.f()[0] != 0.0f) return "wrote before the buffer";
        return "";
      });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << "\n" << daemon.Log();
}

TEST(DeviceMemoryTest, HostAndDeviceMemoryInOneOperationAreRefused) {
  DaemonProcess daemon({"--fake_gpus=1"});
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  const std::vector<std::string> errors = RunRanks(
      daemon, 2,
      [&](int rank, Client& client, Comm& comm) -> std::string {
        FakeDeviceMemory dev(0, 4096);
        auto db = client.RegisterDeviceMemory(dev.fd, 4096, 0, dev.view);
        auto hb = client.Allocate(4096);
        if (!db.ok() || !hb.ok()) return "register failed";
        // One rank mixes them in one operation: refused at once, for that rank.
        if (rank == 0) {
          absl::Status s = comm.AllReduce(*db, *hb, 16, DataType::kFloat32, RedOp::kSum).wait();
          if (s.code() != absl::StatusCode::kInvalidArgument ||
              s.message().find("must all be host memory or all on one device") ==
                  std::string::npos) {
            return "mixed buffers: " + s.ToString();
          }
        }
        // The ranks disagree: rank 0 on the device, rank 1 on the host. Both are told.
        absl::Status s = rank == 0
                             ? comm.AllReduce(*db, *db, 16, DataType::kFloat32, RedOp::kSum).wait()
                             : comm.AllReduce(*hb, *hb, 16, DataType::kFloat32, RedOp::kSum).wait();
        if (s.code() != absl::StatusCode::kInvalidArgument ||
            s.message().find("disagree on where their buffers are") == std::string::npos) {
          return "disagreeing ranks: " + s.ToString();
        }
        return "";
      },
      Ending::kAborted);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  // A disagreement fails the communicator, as any other does; the daemon goes on serving. On a
  // fresh communicator: a Send from device memory into a Recv of host memory fails both ends
  // (and only them), then a host AllReduce is exact.
  const std::vector<std::string> after =
      RunRanks(daemon, 2, [&](int rank, Client& client, Comm& comm) -> std::string {
        FakeDeviceMemory dev(0, 4096);
        auto db = client.RegisterDeviceMemory(dev.fd, 4096, 0, dev.view);
        auto hb = client.Allocate(64);
        if (!hb.ok() || !db.ok()) return "allocate failed";
        absl::Status s = rank == 0 ? comm.Send(*db, 16, DataType::kFloat32, 1).wait()
                                   : comm.Recv(*hb, 16, DataType::kFloat32, 0).wait();
        if (s.code() != absl::StatusCode::kInvalidArgument ||
            s.message().find("rank 0 sends from memory of device 0, rank 1 receives into host "
                             "memory") == std::string::npos) {
          return "send/recv between device and host memory: " + s.ToString();
        }
        static_cast<float*>(hb->data())[0] = static_cast<float>(rank + 1);
        if (auto e = Check(comm.AllReduce(*hb, *hb, 1, DataType::kFloat32, RedOp::kSum).wait(),
                           "host allreduce");
            !e.empty()) {
          return e;
        }
        return static_cast<float*>(hb->data())[0] == 3.0f ? "" : "host allreduce value wrong";
      });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(after[r], "") << "rank " << r;
}

// Across nodes device memory is staged through host memory (daemon/submit/device_staging.h): two
// daemons with two ranks each, every buffer device memory, values checked after each operation.
TEST(DeviceMemoryTest, CollectivesAcrossNodesOnDeviceBuffersAreExact) {
  VirtualCluster cluster(2, {"--fake_gpus=1"}, PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  constexpr int kRanks = 4;  // ranks 0, 1 on vnode0; 2, 3 on vnode1
  constexpr size_t kCount = 100003;
  const std::vector<std::string> errors =
      RunRanks(cluster, 2, kRanks, [&](int r, Client& client, Comm& comm) -> std::string {
        if (comm.nnodes() != 2) return "not across two nodes";
        FakeDeviceMemory send(0, kCount * 4 * kRanks), recv(0, kCount * 4 * kRanks);
        auto sb = client.RegisterDeviceMemory(send.fd, send.bytes, 0, send.view);
        auto rb = client.RegisterDeviceMemory(recv.fd, recv.bytes, 0, recv.view);
        if (!sb.ok() || !rb.ok()) return "register failed";
        const float me = static_cast<float>(r + 1);
        for (size_t i = 0; i < kCount; ++i) send.f()[i] = me * static_cast<float>(i % 89);
        absl::Status s = comm.AllReduce(*sb, *rb, kCount, DataType::kFloat32, RedOp::kSum).wait();
        if (!s.ok()) return "allreduce: " + s.ToString();
        for (size_t i = 0; i < kCount; ++i) {
          if (recv.f()[i] != 10.0f * static_cast<float>(i % 89)) return "allreduce value wrong";
        }
        // The send buffer is not written back over (out of place).
        if (send.f()[88] != me * 88) return "send buffer changed";
        s = comm.AllReduce(*sb, *sb, kCount, DataType::kFloat32, RedOp::kMax).wait();
        if (!s.ok()) return "allreduce in place: " + s.ToString();
        if (send.f()[88] != 4.0f * 88) return "in-place max wrong";
        for (size_t i = 0; i < kCount; ++i) send.f()[i] = me;
        s = comm.AllGather(*sb, *rb, kCount, DataType::kFloat32).wait();
        if (!s.ok()) return "allgather: " + s.ToString();
        for (int q = 0; q < kRanks; ++q) {
          if (recv.f()[q * kCount + kCount - 1] != q + 1.0f) return "allgather value wrong";
        }
        // Send/Recv across the nodes: rank r to rank (r + 2) % 4.
        Work sw = comm.Send(*sb, kCount, DataType::kFloat32, (r + 2) % kRanks);
        Work rw = comm.Recv(*rb, kCount, DataType::kFloat32, (r + 2) % kRanks);
        if (!(s = sw.wait()).ok() || !(s = rw.wait()).ok()) return "send/recv: " + s.ToString();
        if (recv.f()[kCount / 2] != static_cast<float>((r + 2) % kRanks + 1)) {
          return "recv value wrong";
        }
        // Ranks 1 and 3 may still be exchanging when 0 and 2 are done; RunRanks has the ranks
        // meet before they leave (leaving would abort their pair: docs/local-api.md).
        return "";
      });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r << "\n" << cluster.Logs();
  }
  // Each daemon's staging copies were charged and given back.
  for (int n = 0; n < 2; ++n) EXPECT_EQ(cluster[n].Status().buffer_bytes(), 0u);
  // Operators see how device memory crosses nodes, and what this UCX could do instead.
  const std::string devices = cluster[0].Status().devices();
  EXPECT_THAT(devices, HasSubstr("across nodes: staged through host memory (this UCX has "));
  EXPECT_THAT(devices, ::testing::AnyOf(HasSubstr("no CUDA transports: "),
                                        HasSubstr("GPUDirect through them is not built yet")));
  std::cerr << "devices: " << devices << "\n";
}

// Staging buffers are reused from operation to operation (device::StagingPool), and an operation
// that writes its whole recv region has it staged without copying it in first. Every collective
// across nodes on device buffers, twice over (the second round runs on buffers holding the first
// round's data): every element of every recv region is exactly its result, or, where the
// operation writes nothing (a Reduce's non-root, AllToAllv's gaps), still the sentinel the rank
// put there.
// Where the staging copy to host memory runs: on the thread that took the submission (these
// sizes are within the default --staging_inline_bytes), or on the device's thread, in the order
// the rank submitted (--staging_inline_bytes=0), pipelined with the operation or before it.
class StagingThreadTest : public ::testing::TestWithParam<std::vector<std::string>> {
 protected:
  // `flags` and the parameter's.
  std::vector<std::string> With(std::vector<std::string> flags) const {
    flags.insert(flags.end(), GetParam().begin(), GetParam().end());
    return flags;
  }
};

TEST_P(StagingThreadTest, EveryCollectiveAcrossNodesWritesExactlyItsResultThroughReusedStaging) {
  VirtualCluster cluster(2, With({"--fake_gpus=1"}), PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  constexpr int kRanks = 4;     // ranks 0, 1 on vnode0; 2, 3 on vnode1
  constexpr size_t kN = 40000;  // elements per rank (per peer block for the all-to-alls)
  constexpr float kSentinel = -3.0f;
  const std::vector<std::string> errors =
      RunRanks(cluster, 2, kRanks, [&](int r, Client& client, Comm& comm) -> std::string {
        FakeDeviceMemory send(0, kN * 4 * kRanks), recv(0, kN * 4 * kRanks);
        auto sb = client.RegisterDeviceMemory(send.fd, send.bytes, 0, send.view);
        auto rb = client.RegisterDeviceMemory(recv.fd, recv.bytes, 0, recv.view);
        if (!sb.ok() || !rb.ok()) return "register failed";
        float* in = send.f();
        float* out = recv.f();
        const float me = static_cast<float>(r + 1);
        // Runs one operation on a recv region full of sentinels, then checks all of it.
        auto check = [&](const std::string& what, Work work,
                         const std::function<float(size_t)>& expected) -> std::string {
          absl::Status s = work.wait();
          if (!s.ok()) return what + ": " + s.ToString();
          for (size_t i = 0; i < kN * kRanks; ++i) {
            if (out[i] != expected(i)) {
              return what + ": element " + std::to_string(i) + " is " + std::to_string(out[i]) +
                     ", expected " + std::to_string(expected(i));
            }
          }
          std::fill(out, out + kN * kRanks, kSentinel);
          return "";
        };
        std::fill(out, out + kN * kRanks, kSentinel);
        for (int round = 0; round < 2; ++round) {
          std::string e;
          for (size_t i = 0; i < kN * kRanks; ++i) in[i] = me * static_cast<float>(i % 89);
          e = check("allreduce", comm.AllReduce(*sb, *rb, kN, DataType::kFloat32, RedOp::kSum),
                    [&](size_t i) { return i < kN ? 10.0f * (i % 89) : kSentinel; });
          if (!e.empty()) return e;
          // Small enough for its first message to ride in the operation digest, which leaves
          // before the run: pipelined, such a send waits for its bytes like any other step.
          e = check("small allreduce",
                    comm.AllReduce(*sb, *rb, 100, DataType::kFloat32, RedOp::kSum),
                    [&](size_t i) { return i < 100 ? 10.0f * (i % 89) : kSentinel; });
          if (!e.empty()) return e;
          // In place: one region, copied in and back (pipelined: back as the run writes it).
          for (size_t i = 0; i < kN; ++i) out[i] = me * static_cast<float>(i % 89);
          e = check("allreduce in place",
                    comm.AllReduce(*rb, *rb, kN, DataType::kFloat32, RedOp::kSum),
                    [&](size_t i) { return i < kN ? 10.0f * (i % 89) : kSentinel; });
          if (!e.empty()) return e;
          e = check("reducescatter",
                    comm.ReduceScatter(*sb, *rb, kN, DataType::kFloat32, RedOp::kSum),
                    [&](size_t i) { return i < kN ? 10.0f * ((r * kN + i) % 89) : kSentinel; });
          if (!e.empty()) return e;
          std::fill(in, in + kN * kRanks, me);
          e = check("allgather", comm.AllGather(*sb, *rb, kN, DataType::kFloat32),
                    [&](size_t i) { return static_cast<float>(i / kN + 1); });
          if (!e.empty()) return e;
          e = check("broadcast from rank 2", comm.Broadcast(*sb, *rb, kN, DataType::kFloat32, 2),
                    [&](size_t i) { return i < kN ? 3.0f : kSentinel; });
          if (!e.empty()) return e;
          e = check("reduce to rank 1",
                    comm.Reduce(*sb, *rb, kN, DataType::kFloat32, RedOp::kSum, 1),
                    [&](size_t i) { return i < kN && r == 1 ? 10.0f : kSentinel; });
          if (!e.empty()) return e;
          for (int q = 0; q < kRanks; ++q) {
            std::fill(in + q * kN, in + (q + 1) * kN, static_cast<float>(100 * r + q));
          }
          e = check("alltoall", comm.AllToAll(*sb, *rb, kN, DataType::kFloat32),
                    [&](size_t i) { return static_cast<float>(100 * (i / kN) + r); });
          if (!e.empty()) return e;
          // Half of each peer's block, at the start of its slot: the other halves are gaps.
          std::vector<uint64_t> counts(kRanks, kN / 2), displs(kRanks);
          for (int q = 0; q < kRanks; ++q) displs[q] = q * kN;
          e = check("alltoallv",
                    comm.AllToAllv(*sb, counts, displs, *rb, counts, displs, DataType::kFloat32),
                    [&](size_t i) {
                      return i % kN < kN / 2 ? static_cast<float>(100 * (i / kN) + r) : kSentinel;
                    });
          if (!e.empty()) return e;
        }
        return "";
      });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r << "\n" << cluster.Logs();
  }
  for (int n = 0; n < 2; ++n) EXPECT_EQ(cluster[n].Status().buffer_bytes(), 0u);
}

// Staging copies count against the session's buffer bytes: past the quota the operation is
// refused before it reaches the communicator, and the ranks go on.
TEST_P(StagingThreadTest, StagingPastTheBufferQuotaIsRefusedAndTheRanksGoOn) {
  VirtualCluster cluster(2, With({"--fake_gpus=1", "--max_buffer_bytes_per_session=12289"}),
                         PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  const std::vector<std::string> errors =
      RunRanks(cluster, 1, 2, [&](int r, Client& client, Comm& comm) -> std::string {
        FakeDeviceMemory send(0, 4096), recv(0, 4096);
        auto sb = client.RegisterDeviceMemory(send.fd, 4096, 0, send.view);
        auto rb = client.RegisterDeviceMemory(recv.fd, 4096, 0, recv.view);
        if (!sb.ok() || !rb.ok()) return "register failed";
        if (r == 0) {  // 8192 more bytes than the 12289 the session may hold with its 8192
          absl::Status s = comm.AllReduce(*sb, *rb, 1024, DataType::kFloat32, RedOp::kSum).wait();
          if (s.code() != absl::StatusCode::kResourceExhausted ||
              s.message().find("staging 8192 bytes of device memory") == std::string::npos) {
            return "out of place past the quota: " + s.ToString();
          }
        }
        for (size_t i = 0; i < 1024; ++i) send.f()[i] = r + 1.0f;
        absl::Status s = comm.AllReduce(*sb, *sb, 1024, DataType::kFloat32, RedOp::kSum).wait();
        if (!s.ok()) return "in place within the quota: " + s.ToString();
        return send.f()[1023] == 3.0f ? "" : "in-place value wrong";
      });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << "\n" << cluster.Logs();
}

// A rank's operations reuse the staging buffers the one before it returned, and /metrics says
// so: every lease counted once (allocated or reused), none left out on lease, the buffers kept
// idle. (The pool gets its buffers back before the client hears of the completion, so the
// next operation finds them; only a copy in that is still ending may hold one a moment longer.)
TEST_P(StagingThreadTest, StagingBuffersAreReusedAndCountedInMetrics) {
  VirtualCluster cluster(2, With({"--fake_gpus=1", "--metrics_listen=127.0.0.1:0"}),
                         PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  constexpr int kOps = 6;
  constexpr size_t kN = 16384;  // 64 KiB each way: two leases per operation
  const std::vector<std::string> errors =
      RunRanks(cluster, 1, 2, [&](int r, Client& client, Comm& comm) -> std::string {
        FakeDeviceMemory send(0, kN * 4), recv(0, kN * 4);
        auto sb = client.RegisterDeviceMemory(send.fd, send.bytes, 0, send.view);
        auto rb = client.RegisterDeviceMemory(recv.fd, recv.bytes, 0, recv.view);
        if (!sb.ok() || !rb.ok()) return "register failed";
        for (int k = 0; k < kOps; ++k) {
          for (size_t i = 0; i < kN; ++i) send.f()[i] = static_cast<float>((r + 1) * (i % 89 + k));
          absl::Status s = comm.AllReduce(*sb, *rb, kN, DataType::kFloat32, RedOp::kSum).wait();
          if (!s.ok()) return "allreduce " + std::to_string(k) + ": " + s.ToString();
          for (size_t i = 0; i < kN; ++i) {
            if (recv.f()[i] != 3.0f * static_cast<float>(i % 89 + k)) {
              return "allreduce " + std::to_string(k) + ": element " + std::to_string(i);
            }
          }
        }
        return "";
      });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << "\n" << cluster.Logs();
  for (int n = 0; n < 2; ++n) {
    std::string text;
    for (int i = 0; i < 100; ++i) {  // a copy in still ending returns its buffer a moment later
      text = HttpGet(MetricsAddress(cluster[n]), "/metrics");
      if (text.find("railyard_staging_host_bytes{state=\"leased\"} 0\n") != std::string::npos) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_NE(text.find("railyard_staging_host_bytes{state=\"leased\"} 0\n"), std::string::npos)
        << "node " << n << "\n"
        << text;
    const double allocated =
        SumSamples(text, "railyard_staging_buffers_total{buffer=\"allocated\"}");
    const double reused = SumSamples(text, "railyard_staging_buffers_total{buffer=\"reused\"}");
    EXPECT_EQ(allocated + reused, 2 * kOps) << "node " << n << "\n" << text;
    EXPECT_GE(reused, kOps) << "node " << n << ": most leases should find a buffer\n" << text;
    EXPECT_GE(SumSamples(text, "railyard_staging_host_bytes{state=\"idle\"}"), 2 * kN * 4)
        << "node " << n;
  }
}

// A staged operation handed to the device's thread keeps its place: each rank submits device and
// host operations on one communicator back to back without waiting, and every one of them gets
// the next sequence number in the order the rank submitted it and its exact result (a host
// operation that passed the device one before it would be matched with another rank's device
// operation: a mismatch, or the wrong values). The rank's other communicator is not held behind
// them.
TEST(DeviceMemoryTest, OperationsStagedOnTheDeviceThreadKeepTheOrderTheirRankSubmittedThem) {
  // Chunks of 64 KiB: each staged copy (200 KB) takes several tasks of the device's thread.
  VirtualCluster cluster(
      2, {"--fake_gpus=1", "--staging_inline_bytes=0", "--staging_chunk_bytes=65536"},
      PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  constexpr int kRanks = 4;  // ranks 0, 1 on vnode0; 2, 3 on vnode1
  constexpr size_t kN = 50000;
  constexpr int kRounds = 3;
  const std::vector<std::string> errors =
      RunRanks(cluster, 2, kRanks, [&](int r, Client& client, Comm& comm) -> std::string {
        // drecv: the AllGather's kRanks blocks, then each round's device AllReduce.
        FakeDeviceMemory dsend(0, kN * 4), drecv(0, kN * 4 * (kRanks + kRounds));
        auto ds = client.RegisterDeviceMemory(dsend.fd, dsend.bytes, 0, dsend.view);
        auto dr = client.RegisterDeviceMemory(drecv.fd, drecv.bytes, 0, drecv.view);
        auto hs = client.Allocate(kN * 4);
        auto hr = client.Allocate(kN * 4 * kRounds);
        if (!ds.ok() || !dr.ok() || !hs.ok() || !hr.ok()) return "register failed";
        auto local = client.InitComm(*client.CreateCommId(), 0, 1);
        if (!local.ok()) return "local comm: " + local.status().ToString();
        const float me = static_cast<float>(r + 1);
        for (size_t i = 0; i < kN; ++i) {
          dsend.f()[i] = me * static_cast<float>(i % 97);
          hs->span<float>()[i] = me * 1000.0f + static_cast<float>(i % 7);
        }
        std::vector<Work> works;
        for (int k = 0; k < kRounds; ++k) {
          works.push_back(comm.AllReduce(*ds, BufferRef(*dr, (kRanks + k) * kN * 4), kN,
                                         DataType::kFloat32, RedOp::kSum));
          works.push_back(
              comm.AllReduce(*hs, BufferRef(*hr, k * kN * 4), kN, DataType::kFloat32, RedOp::kMax));
        }
        works.push_back(comm.AllGather(*ds, *dr, kN, DataType::kFloat32));
        // Another communicator of the session: not behind the held ones (a host operation on
        // one rank completes at once).
        auto lb = client.Allocate(4);
        if (!lb.ok()) return "allocate";
        lb->span<float>()[0] = 7.0f;
        if (absl::Status s = local->AllReduce(*lb, *lb, 1, DataType::kFloat32, RedOp::kSum).wait();
            !s.ok() || lb->span<float>()[0] != 7.0f) {
          return "the other communicator: " + s.ToString();
        }
        for (size_t i = 0; i < works.size(); ++i) {
          if (absl::Status s = works[i].wait(); !s.ok()) {
            return "operation " + std::to_string(i) + ": " + s.ToString();
          }
          if (i > 0 && works[i].seq() != works[i - 1].seq() + 1) {
            return "operation " + std::to_string(i) + " has seq " + std::to_string(works[i].seq()) +
                   " after " + std::to_string(works[i - 1].seq());
          }
        }
        for (int k = 0; k < kRounds; ++k) {
          for (size_t i = 0; i < kN; ++i) {
            const float sum = drecv.f()[(kRanks + k) * kN + i];
            if (sum != 10.0f * static_cast<float>(i % 97)) {
              return "device allreduce " + std::to_string(k) + ": element " + std::to_string(i) +
                     " is " + std::to_string(sum);
            }
            if (hr->span<float>()[k * kN + i] != 4000.0f + static_cast<float>(i % 7)) {
              return "host allreduce " + std::to_string(k) + ": element " + std::to_string(i) +
                     " is " + std::to_string(hr->span<float>()[k * kN + i]);
            }
          }
        }
        for (int q = 0; q < kRanks; ++q) {
          for (size_t i = 0; i < kN; ++i) {
            if (drecv.f()[q * kN + i] != (q + 1.0f) * static_cast<float>(i % 97)) {
              return "allgather block " + std::to_string(q) + ": element " + std::to_string(i) +
                     " is " + std::to_string(drecv.f()[q * kN + i]);
            }
          }
        }
        return "";
      });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r << "\n" << cluster.Logs();
  }
  for (int n = 0; n < 2; ++n) EXPECT_EQ(cluster[n].Status().buffer_bytes(), 0u);
}

TEST(DeviceMemoryTest, AStagingChunkSmallerThanAPageIsRefusedAtStart) {
  DaemonProcess d({"--fake_gpus=1", "--staging_chunk_bytes=100"});
  auto code = d.process().Wait(std::chrono::seconds(10));
  ASSERT_TRUE(code.has_value()) << "the daemon started:\n" << d.Log();
  EXPECT_NE(*code, 0);
  EXPECT_THAT(d.Log(), HasSubstr("--staging_chunk_bytes must be at least 4096, not 100"));
}

std::string StagingThreadName(const ::testing::TestParamInfo<std::vector<std::string>>& info) {
  const char* const names[] = {"OnTheSubmittingThread", "OnTheDeviceThreadPipelined",
                               "OnTheDeviceThreadWholeCopyFirst"};
  return names[info.index];
}

INSTANTIATE_TEST_SUITE_P(
    DeviceMemory, StagingThreadTest,
    ::testing::Values(
        std::vector<std::string>{"--staging_inline_bytes=1048576"},
        // Every copy on the device's thread, a page per task, the collectives'
        // steps waiting for their pages (pipelined, the default).
        std::vector<std::string>{"--staging_inline_bytes=0", "--staging_chunk_bytes=4096"},
        // The same, each operation starting after its whole copy.
        std::vector<std::string>{"--staging_inline_bytes=0", "--staging_chunk_bytes=4096",
                                 "--staging_pipeline=false"}),
    StagingThreadName);

}  // namespace
}  // namespace railyard::testing
