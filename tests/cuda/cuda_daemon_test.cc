// Device memory through a real railyardd on a real GPU (skips, saying why, without one): ranks
// (threads, one session each, all on device 0) allocate with Client::AllocateDevice, which the
// daemon imports from the exported descriptor in its own process; AllReduce, AllGather,
// Broadcast and Send/Recv on device buffers, values copied back and checked.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuda/no_gpu.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/virtual_cluster.h"

namespace railyard::testing {
namespace {

std::vector<float> Download(const Buffer& b, size_t count) {
  std::vector<float> out(count);
  EXPECT_EQ(cudaMemcpy(out.data(), b.data(), count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

void Upload(const Buffer& b, const std::vector<float>& v) {
  EXPECT_EQ(cudaMemcpy(b.data(), v.data(), v.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
}

class GpuDaemonTest : public ::testing::TestWithParam<int> {};

TEST_P(GpuDaemonTest, CollectivesOnDeviceBuffersAreExact) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  const int nranks = GetParam();
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  ASSERT_NE(daemon.Status().devices().find("device(s)"), std::string::npos)
      << daemon.Status().devices();
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < nranks; ++r) {
    auto c = Client::Connect(daemon.Options());
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  auto id = clients[0]->CreateCommId();
  ASSERT_TRUE(id.ok());
  constexpr size_t kCount = (size_t{16} << 20) + 5;  // 64 MiB of floats and an odd tail
  std::vector<std::string> errors(nranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const std::string& what) { errors[r] = what; };
      auto comm = clients[r]->InitComm(*id, r, nranks);
      if (!comm.ok()) return fail(std::string(comm.status().message()));
      auto send = clients[r]->AllocateDevice(kCount * 4 * nranks, 0);
      auto recv = clients[r]->AllocateDevice(kCount * 4 * nranks, 0);
      if (!send.ok() || !recv.ok()) {
        return fail("AllocateDevice: " + std::string((send.ok() ? recv : send).status().message()));
      }
      std::vector<float> in(kCount);
      for (size_t i = 0; i < kCount; ++i) in[i] = static_cast<float>((r + 1) * (i % 251));
      Upload(*send, in);
      absl::Status s =
          comm->AllReduce(*send, *recv, kCount, DataType::kFloat32, RedOp::kSum).wait();
      if (!s.ok()) return fail("allreduce: " + s.ToString());
      const float ranks_sum = nranks * (nranks + 1) / 2.0f;
      std::vector<float> out = Download(*recv, kCount);
      for (size_t i = 0; i < kCount; ++i) {
        if (out[i] != ranks_sum * static_cast<float>(i % 251)) return fail("allreduce value");
      }
      s = comm->AllGather(*send, *recv, 1024, DataType::kFloat32).wait();
      if (!s.ok()) return fail("allgather: " + s.ToString());
      out = Download(*recv, 1024 * nranks);
      for (int q = 0; q < nranks; ++q) {
        if (out[q * 1024 + 7] != static_cast<float>((q + 1) * 7)) return fail("allgather value");
      }
      s = comm->Broadcast(*send, *recv, 3, DataType::kFloat32, nranks - 1).wait();
      if (!s.ok()) return fail("broadcast: " + s.ToString());
      out = Download(*recv, 3);
      if (out[2] != static_cast<float>(nranks * 2)) return fail("broadcast value");
      Work sw = comm->Send(*send, 4096, DataType::kFloat32, (r + 1) % nranks);
      Work rw = comm->Recv(*recv, 4096, DataType::kFloat32, (r + nranks - 1) % nranks);
      if (!(s = sw.wait()).ok() || !(s = rw.wait()).ok()) return fail("send/recv: " + s.ToString());
      out = Download(*recv, 4096);
      const int from = (r + nranks - 1) % nranks;
      if (out[300] != static_cast<float>((from + 1) * (300 % 251))) return fail("recv value");
      // Another pair may still be exchanging; a rank leaving now would abort the communicator
      // for it (docs/local-api.md), so the ranks meet first.
      if (!(s = comm->Barrier().wait()).ok()) return fail("closing barrier: " + s.ToString());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < nranks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_EQ(daemon.Status().ops_failed(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuDaemonTest, ::testing::Values(2, 4));

// Across two daemons ("nodes" on loopback, UCX between them) with two ranks each, all on device
// 0: device buffers are staged through host memory (docs/gpu.md), pipelined with the transfers
// or copied whole first (--staging_pipeline). Every value is checked: an AllReduce of 16 MiB and
// an odd tail (four 4 MiB copy chunks, on the device's thread), one in place, four issued back to
// back before any is waited for (as a training loop's buckets are), an AllGather, a
// ReduceScatter and a Broadcast.
class GpuCrossNodeTest : public ::testing::TestWithParam<bool> {};

TEST_P(GpuCrossNodeTest, CollectivesOnDeviceBuffersAcrossDaemonsAreExact) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  constexpr int kNodes = 2, kPerNode = 2, kRanks = kNodes * kPerNode, kLoop = 4;
  constexpr size_t kCount = (size_t{4} << 20) + 5;
  VirtualCluster cluster(kNodes, {std::string("--staging_pipeline=") + (GetParam() ? "1" : "0")},
                         PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < kRanks; ++r) {
    auto c = Client::Connect(cluster[r / kPerNode].Options());
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  auto id = clients[0]->CreateCommId();
  ASSERT_TRUE(id.ok());
  // Element i of rank r's input: (r + 1) * (i % 251 + k) for the k-th operation.
  auto input = [](int r, size_t i, int k) { return static_cast<float>((r + 1) * (i % 251 + k)); };
  constexpr float kRankSum = kRanks * (kRanks + 1) / 2.0f;
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      errors[r] = [&]() -> std::string {
        if (cudaSetDevice(0) != cudaSuccess) return "cudaSetDevice";
        auto comm = clients[r]->InitComm(*id, r, kRanks);
        if (!comm.ok()) return "InitComm: " + comm.status().ToString();
        std::vector<Buffer> send, recv;
        for (int k = 0; k < kLoop; ++k) {
          auto s = clients[r]->AllocateDevice(kCount * 4, 0);
          auto v = clients[r]->AllocateDevice(kCount * 4, 0);
          if (!s.ok() || !v.ok()) return "AllocateDevice: " + (s.ok() ? v : s).status().ToString();
          send.push_back(*std::move(s));
          recv.push_back(*std::move(v));
          std::vector<float> in(kCount);
          for (size_t i = 0; i < kCount; ++i) in[i] = input(r, i, k);
          Upload(send[k], in);
        }
        auto check = [&](const Buffer& b, size_t count, auto want) -> std::string {
          std::vector<float> out = Download(b, count);
          for (size_t i = 0; i < count; ++i) {
            if (out[i] != want(i)) {
              return "element " + std::to_string(i) + " is " + std::to_string(out[i]) + ", not " +
                     std::to_string(want(i));
            }
          }
          return "";
        };
        auto sum = [&](int k) { return [&, k](size_t i) { return kRankSum * (i % 251 + k); }; };
        absl::Status s =
            comm->AllReduce(send[0], recv[0], kCount, DataType::kFloat32, RedOp::kSum).wait();
        if (!s.ok()) return "allreduce: " + s.ToString();
        if (std::string e = check(recv[0], kCount, sum(0)); !e.empty()) return "allreduce " + e;
        s = comm->AllReduce(send[1], send[1], kCount, DataType::kFloat32, RedOp::kSum).wait();
        if (!s.ok()) return "in-place allreduce: " + s.ToString();
        if (std::string e = check(send[1], kCount, sum(1)); !e.empty()) return "in place " + e;
        std::vector<Work> loop;
        for (int k = 0; k < kLoop; ++k) {
          loop.push_back(
              comm->AllReduce(recv[k], recv[k], kCount, DataType::kFloat32, RedOp::kSum));
        }
        for (int k = 0; k < kLoop; ++k) {
          if (!(s = loop[k].wait()).ok()) return "back-to-back allreduce: " + s.ToString();
        }
        // recv[0] held sum(0) on every rank: now kRanks * sum(0). recv[k > 0] held whatever the
        // earlier steps left: check only the ones whose contents are known.
        if (std::string e = check(recv[0], kCount, [&](size_t i) { return kRanks * sum(0)(i); });
            !e.empty()) {
          return "back-to-back allreduce " + e;
        }
        s = comm->AllGather(send[2], recv[3], kCount / kRanks, DataType::kFloat32).wait();
        if (!s.ok()) return "allgather: " + s.ToString();
        if (std::string e = check(recv[3], kCount / kRanks * kRanks,
                                  [&](size_t i) {
                                    const size_t per = kCount / kRanks;
                                    return input(static_cast<int>(i / per), i % per, 2);
                                  });
            !e.empty()) {
          return "allgather " + e;
        }
        s = comm->ReduceScatter(send[3], recv[2], kCount / kRanks, DataType::kFloat32, RedOp::kSum)
                .wait();
        if (!s.ok()) return "reducescatter: " + s.ToString();
        if (std::string e =
                check(recv[2], kCount / kRanks,
                      [&](size_t i) { return kRankSum * ((r * (kCount / kRanks) + i) % 251 + 3); });
            !e.empty()) {
          return "reducescatter " + e;
        }
        s = comm->Broadcast(send[2], recv[1], kCount, DataType::kFloat32, kRanks - 1).wait();
        if (!s.ok()) return "broadcast: " + s.ToString();
        if (std::string e =
                check(recv[1], kCount, [&](size_t i) { return input(kRanks - 1, i, 2); });
            !e.empty()) {
          return "broadcast " + e;
        }
        if (!(s = comm->Barrier().wait()).ok()) return "closing barrier: " + s.ToString();
        return "";
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  if (HasFailure()) ADD_FAILURE() << cluster.Logs();
}

INSTANTIATE_TEST_SUITE_P(StagingPipeline, GpuCrossNodeTest, ::testing::Bool());

// Client::RegisterDevicePointer on memory a framework allocated: cudaMalloc'd memory goes by
// legacy CUDA IPC (a daemon with --cuda_ipc; refused, saying so, by one without), a VMM
// allocation by its descriptor; the two ranks' AllReduce is exact either way.
TEST(GpuPointerTest, CudaMallocMemoryGoesByIpcAndVmmMemoryByDescriptor) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  constexpr size_t kCount = (size_t{1} << 20) + 3;
  void* malloced = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&malloced, 2 * kCount * 4 + 256), cudaSuccess);
  {
    DaemonProcess strict;
    ASSERT_TRUE(strict.ready()) << strict.Log();
    auto c = Client::Connect(strict.Options());
    ASSERT_TRUE(c.ok()) << c.status();
    auto b = (*c)->RegisterDevicePointer(malloced, kCount * 4, 0);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  }
  DaemonProcess daemon({"--cuda_ipc"});
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < 2; ++r) {
    auto c = Client::Connect(daemon.Options());
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  auto id = clients[0]->CreateCommId();
  ASSERT_TRUE(id.ok());
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const std::string& what) { errors[r] = what; };
      auto comm = clients[r]->InitComm(*id, r, 2);
      if (!comm.ok()) return fail(std::string(comm.status().message()));
      absl::StatusOr<Buffer> buf;
      absl::StatusOr<Buffer> vmm;
      if (r == 0) {  // 256 bytes into the cudaMalloc'd allocation
        buf = clients[r]->RegisterDevicePointer(static_cast<char*>(malloced) + 256, 2 * kCount * 4,
                                                0);
      } else {
        vmm = clients[r]->AllocateDevice(2 * kCount * 4, 0);
        if (!vmm.ok()) return fail("AllocateDevice: " + vmm.status().ToString());
        auto inside = clients[r]->RegisterDevicePointer(static_cast<char*>(vmm->data()) + 4, 8, 0);
        if (inside.status().code() != absl::StatusCode::kInvalidArgument) {
          return fail("VMM memory at an offset: " + inside.status().ToString());
        }
        buf = clients[r]->RegisterDevicePointer(vmm->data(), 2 * kCount * 4, 0);
      }
      if (!buf.ok()) return fail("RegisterDevicePointer: " + buf.status().ToString());
      std::vector<float> in(kCount);
      for (size_t i = 0; i < kCount; ++i) in[i] = static_cast<float>((r + 1) * (i % 13));
      if (cudaMemcpy(buf->data(), in.data(), kCount * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
        return fail("upload");
      }
      absl::Status s = comm->AllReduce(BufferRef(*buf, 0), BufferRef(*buf, kCount * 4), kCount,
                                       DataType::kFloat32, RedOp::kSum)
                           .wait();
      if (!s.ok()) return fail("allreduce: " + s.ToString());
      std::vector<float> out(kCount);
      if (cudaMemcpy(out.data(), static_cast<char*>(buf->data()) + kCount * 4, kCount * 4,
                     cudaMemcpyDeviceToHost) != cudaSuccess) {
        return fail("download");
      }
      for (size_t i = 0; i < kCount; ++i) {
        if (out[i] != 3.0f * static_cast<float>(i % 13)) return fail("allreduce value");
      }
      if (!(s = comm->Barrier().wait()).ok()) return fail("closing barrier: " + s.ToString());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << "\n" << daemon.Log();
  clients.clear();
  cudaFree(malloced);
}

// Stream ordering on a real stream (docs/gpu.md): each rank's stream is held by a host function
// until the host has submitted everything, then copies the input in, runs the AllReduce
// (CollectiveOptions::stream: cuStreamWriteValue32 / cuStreamWaitValue32 on the client's host
// words) and copies the result out, all in pinned memory; the host waits only for the stream.
TEST(GpuStreamTest, AnAllReduceOnAStreamIsOrderedWithTheStreamsCopies) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  constexpr int kRanks = 2;
  constexpr size_t kCount = (size_t{4} << 20) + 3;
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < kRanks; ++r) {
    auto c = Client::Connect(daemon.Options());
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  auto id = clients[0]->CreateCommId();
  ASSERT_TRUE(id.ok());
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      errors[r] = [&]() -> std::string {
        if (cudaSetDevice(0) != cudaSuccess) return "cudaSetDevice";
        auto comm = clients[r]->InitComm(*id, r, kRanks);
        if (!comm.ok()) return comm.status().ToString();
        auto send = clients[r]->AllocateDevice(kCount * 4, 0);
        auto recv = clients[r]->AllocateDevice(kCount * 4, 0);
        if (!send.ok() || !recv.ok()) return "AllocateDevice failed";
        float *in = nullptr, *out = nullptr;
        if (cudaMallocHost(reinterpret_cast<void**>(&in), kCount * 4) != cudaSuccess ||
            cudaMallocHost(reinterpret_cast<void**>(&out), kCount * 4) != cudaSuccess) {
          return "cudaMallocHost failed";
        }
        for (size_t i = 0; i < kCount; ++i) in[i] = static_cast<float>((r + 1) * (i % 97));
        cudaStream_t stream = nullptr;
        if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
          return "cudaStreamCreate failed";
        }
        std::atomic<bool> go{false};
        cudaLaunchHostFunc(
            stream,
            [](void* flag) {
              for (int i = 0; i < 30000 && !static_cast<std::atomic<bool>*>(flag)->load(); ++i) {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
              }
            },
            &go);
        cudaMemcpyAsync(send->data(), in, kCount * 4, cudaMemcpyHostToDevice, stream);
        CollectiveOptions o;
        o.stream = stream;
        Work w = comm->AllReduce(*send, *recv, kCount, DataType::kFloat32, RedOp::kSum, o);
        cudaMemcpyAsync(out, recv->data(), kCount * 4, cudaMemcpyDeviceToHost, stream);
        const bool early = w.test();
        go = true;
        if (cudaStreamSynchronize(stream) != cudaSuccess) return "cudaStreamSynchronize failed";
        if (early) return "the AllReduce completed before its stream reached it";
        std::string e;
        for (size_t i = 0; i < kCount && e.empty(); ++i) {
          if (out[i] != 3.0f * static_cast<float>(i % 97)) e = "value " + std::to_string(i);
        }
        if (absl::Status s = w.wait(std::chrono::seconds(30)); !s.ok() && e.empty()) {
          e = s.ToString();
        }
        if (e.empty()) {
          if (absl::Status s = comm->Barrier().wait(); !s.ok()) e = "barrier: " + s.ToString();
        }
        cudaStreamDestroy(stream);
        cudaFreeHost(in);
        cudaFreeHost(out);
        return e;
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << "\n" << daemon.Log();
}

}  // namespace
}  // namespace railyard::testing
