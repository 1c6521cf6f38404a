// The device seam's contract (daemon/device/device_runtime.h) on the fake runtime: what Import
// checks, that steps run only on imported device memory of their device, and that a mapping is
// gone when the last holder lets go. The same contract on a real GPU: tests/cuda.
#include "daemon/device/device_runtime.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "daemon/device/fake_device_runtime.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/local_plan.h"

namespace railyard::device {
namespace {

using kernels::DataType;
using kernels::RedOp;

// A host view of a fake allocation (what a test reads and writes in place of cudaMemcpy).
struct HostView {
  explicit HostView(int fd, size_t bytes) : bytes(bytes) {
    p = static_cast<std::byte*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  }
  ~HostView() { ::munmap(p, bytes); }
  float* f() const { return reinterpret_cast<float*>(p); }
  std::byte* p;
  size_t bytes;
};

TEST(FakeDeviceRuntimeTest, ImportChecksSizeDeviceAndWhatTheDescriptorIs) {
  FakeDeviceRuntime rt(2);
  absl::StatusOr<UniqueFd> fd = FakeDeviceRuntime::Allocate(1, 4096);
  ASSERT_TRUE(fd.ok()) << fd.status();

  auto import = [&](int device, uint64_t size) {
    return rt.Import(device, UniqueFd(::dup(fd->get())), size).status();
  };
  absl::Status s = import(1, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("must be > 0"), std::string::npos) << s;
  s = import(2, 4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("device 2 is not one of the 2 devices"), std::string::npos) << s;
  s = import(-1, 4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = import(0, 4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lives on device 1, not on device 0"), std::string::npos) << s;
  s = import(1, 4097);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("4097 bytes does not fit the exported allocation of 4096"),
            std::string::npos)
      << s;
  // Host memory passed as device memory: a plain memfd, and a closed descriptor.
  UniqueFd plain(::memfd_create("not-device-memory", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(plain.get(), 4096), 0);
  s = rt.Import(1, std::move(plain), 4096).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not an exported device allocation"), std::string::npos) << s;
  s = rt.Import(1, UniqueFd(), 4096).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.live_mappings(), 0u);
  EXPECT_TRUE(import(1, 4096).ok());
}

// Legacy CUDA IPC on the fake: the handle names its maker's process and descriptor. What
// ImportIpc checks, and that the mapping is the registered range of the allocation.
TEST(FakeDeviceRuntimeTest, ImportIpcChecksTheHandleItsMakerAndTheRange) {
  FakeDeviceRuntime rt(2);
  absl::StatusOr<UniqueFd> fd = FakeDeviceRuntime::Allocate(1, 8192);
  ASSERT_TRUE(fd.ok()) << fd.status();
  HostView view(fd->get(), 8192);
  absl::StatusOr<std::string> handle = FakeDeviceRuntime::ExportIpc(fd->get());
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_EQ(handle->size(), DeviceRuntime::kCudaIpcHandleBytes);
  const int64_t me = ::getpid();

  // Bytes 1000..5095 of the allocation: the mapping starts there.
  absl::StatusOr<std::shared_ptr<DeviceMapping>> m = rt.ImportIpc(1, *handle, 1000, 4096, me);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->size(), 4096u);
  EXPECT_EQ(rt.DeviceOf((*m)->data()), 1);
  EXPECT_EQ(rt.DeviceOf((*m)->data() + 4096), -1);  // past the registered range
  std::memset(view.p, 0, 8192);
  float out = 0;
  view.f()[250] = 7.5f;  // byte 1000: the mapping's first float
  ASSERT_TRUE(rt.CopyToHost(1, &out, (*m)->data(), sizeof(out)).ok());
  EXPECT_EQ(out, 7.5f);
  // A second buffer in the same allocation, as a framework's allocator hands out.
  absl::StatusOr<std::shared_ptr<DeviceMapping>> m2 = rt.ImportIpc(1, *handle, 0, 1000, me);
  ASSERT_TRUE(m2.ok()) << m2.status();
  EXPECT_EQ(rt.live_mappings(), 2u);

  auto refused = [&](std::string_view h, uint64_t offset, uint64_t size, int64_t pid,
                     int device = 1) {
    return rt.ImportIpc(device, h, offset, size, pid).status();
  };
  absl::Status s = refused(handle->substr(0, 63), 0, 4096, me);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a CUDA IPC handle has 64 bytes, not 63"), std::string::npos) << s;
  s = refused(std::string(64, 'x'), 0, 4096, me);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not one this (fake) runtime made"), std::string::npos) << s;
  // Another process's handle (here: one naming this process, presented by a session of pid 1).
  s = refused(*handle, 0, 4096, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("made by process " + std::to_string(me) +
                             ", not by this session's process 1"),
            std::string::npos)
      << s;
  s = refused(*handle, 4097, 4096, me);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("4096 bytes at offset 4097 does not fit the exported allocation of "
                             "8192 bytes"),
            std::string::npos)
      << s;
  s = refused(*handle, ~uint64_t{0}, 2, me);  // offset + size wraps
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = refused(*handle, 0, 4096, me, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lives on device 1, not on device 0"), std::string::npos) << s;
  // A descriptor that is not a device allocation, and one that is no longer open.
  UniqueFd plain(::memfd_create("not-device-memory", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(plain.get(), 4096), 0);
  s = refused(*FakeDeviceRuntime::ExportIpc(plain.get()), 0, 4096, me);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not an exported device allocation"), std::string::npos) << s;
  const int closed = ::dup(plain.get());
  ::close(closed);
  s = refused(*FakeDeviceRuntime::ExportIpc(closed), 0, 4096, me);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cannot open the CUDA IPC handle's allocation"), std::string::npos)
      << s;
  EXPECT_EQ(rt.live_mappings(), 2u);
  m->reset();
  m2->reset();
  EXPECT_EQ(rt.live_mappings(), 0u);
}

TEST(FakeDeviceRuntimeTest, StepsReduceIntoEveryDestinationAndTouchOnlyDeviceMemory) {
  FakeDeviceRuntime rt(1);
  constexpr size_t kCount = 1000;
  constexpr size_t kBytes = kCount * sizeof(float);
  std::vector<UniqueFd> fds;
  std::vector<std::shared_ptr<DeviceMapping>> maps;
  std::vector<std::unique_ptr<HostView>> views;
  for (int k = 0; k < 4; ++k) {
    absl::StatusOr<UniqueFd> fd = FakeDeviceRuntime::Allocate(0, kBytes);
    ASSERT_TRUE(fd.ok());
    views.push_back(std::make_unique<HostView>(fd->get(), kBytes));
    absl::StatusOr<std::shared_ptr<DeviceMapping>> m =
        rt.Import(0, UniqueFd(::dup(fd->get())), kBytes);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->size(), kBytes);
    EXPECT_EQ((*m)->device(), 0);
    // The device address is not where the host sees the memory.
    EXPECT_NE((*m)->data(), views.back()->p);
    maps.push_back(*m);
  }
  for (size_t i = 0; i < kCount; ++i) {
    views[0]->f()[i] = static_cast<float>(i);
    views[1]->f()[i] = 2.0f * static_cast<float>(i);
  }
  void* dsts[] = {maps[2]->data(), maps[3]->data(), maps[0]->data()};  // one of them in place
  const void* srcs[] = {maps[0]->data(), maps[1]->data()};
  ASSERT_TRUE(
      rt.ReduceToMany(0, DataType::kFloat32, RedOp::kSum, dsts, 3, srcs, 2, kCount, 1).ok());
  ASSERT_TRUE(rt.Synchronize(0).ok());
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(views[2]->f()[i], 3.0f * static_cast<float>(i)) << i;
    ASSERT_EQ(views[3]->f()[i], 3.0f * static_cast<float>(i)) << i;
    ASSERT_EQ(views[0]->f()[i], 3.0f * static_cast<float>(i)) << i;
  }
  ASSERT_TRUE(rt.Copy(0, maps[1]->data(), maps[2]->data(), kBytes).ok());
  EXPECT_EQ(views[1]->f()[999], 2997.0f);
  views[3]->f()[0] = -1.0f;
  ASSERT_TRUE(rt.Swap(0, maps[3]->data(), maps[1]->data(), 4).ok());
  EXPECT_EQ(views[1]->f()[0], -1.0f);
  EXPECT_EQ(rt.steps(), 3u);

  // A host pointer, a range running past the mapping, another device: refused, nothing run.
  std::vector<float> host(kCount);
  absl::Status s = rt.Copy(0, host.data(), maps[0]->data(), kBytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("is not device memory imported on device 0"), std::string::npos) << s;
  s = rt.Copy(0, maps[0]->data() + 4, maps[1]->data(), kBytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  const void* one[] = {maps[0]->data()};
  void* out[] = {maps[1]->data()};
  EXPECT_FALSE(rt.ReduceToMany(0, DataType::kFloat32, RedOp::kSum, out, 1, one, 0, 1, 1).ok());
  EXPECT_FALSE(rt.Synchronize(1).ok());
  EXPECT_EQ(rt.steps(), 3u);

  EXPECT_EQ(rt.live_mappings(), 4u);
  maps.clear();
  EXPECT_EQ(rt.live_mappings(), 0u);
}

// More local ranks than one launch takes (kMaxPointers sources): the plan's reduce runs in passes
// into one destination and copies from it (scheduler::RunDeviceSteps), in place and not, for an
// average too, with every value checked.
TEST(FakeDeviceRuntimeTest, AReduceOfMoreRanksThanOneLaunchTakesRunsInPasses) {
  FakeDeviceRuntime rt(1);
  constexpr int kRanks = 2 * DeviceRuntime::kMaxPointers + 7;  // three passes
  constexpr size_t kCount = 257;
  constexpr size_t kBlock = kCount * sizeof(float);
  std::vector<std::unique_ptr<HostView>> views;
  std::vector<std::shared_ptr<DeviceMapping>> maps;
  for (int r = 0; r < 2 * kRanks; ++r) {  // a send and a recv region per rank
    absl::StatusOr<UniqueFd> fd = FakeDeviceRuntime::Allocate(0, kBlock * kRanks);
    ASSERT_TRUE(fd.ok());
    views.push_back(std::make_unique<HostView>(fd->get(), kBlock * kRanks));
    absl::StatusOr<std::shared_ptr<DeviceMapping>> m =
        rt.Import(0, *std::move(fd), kBlock * kRanks);
    ASSERT_TRUE(m.ok()) << m.status();
    maps.push_back(*m);
  }
  const float ranks_sum = kRanks * (kRanks - 1) / 2.0f;
  auto run = [&](scheduler::OpKind op, RedOp red, bool in_place) {
    std::vector<scheduler::RankRequest> reqs(kRanks);
    std::vector<const scheduler::RankRequest*> ptrs;
    for (int r = 0; r < kRanks; ++r) {
      scheduler::RankRequest& q = reqs[r];
      q.op = op;
      q.dtype = DataType::kFloat32;
      q.red_op = red;
      q.count = kCount;
      q.device = 0;
      q.send = maps[2 * r]->data();
      q.recv = in_place ? (op == scheduler::OpKind::kReduceScatter ? q.send + r * kBlock : q.send)
                        : maps[2 * r + 1]->data();
      ptrs.push_back(&q);
    }
    scheduler::LocalPlan plan;
    scheduler::BuildLocalPlan(ptrs, scheduler::kDefaultChunkBytes, &plan);
    return scheduler::RunDeviceSteps(plan, &rt);
  };
  auto fill = [&](int blocks) {
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < kCount * blocks; ++i) {
        views[2 * r]->f()[i] = static_cast<float>(r) + static_cast<float>(i % kCount);
      }
    }
  };
  // AllReduce in place, sum.
  fill(1);
  ASSERT_TRUE(run(scheduler::OpKind::kAllReduce, RedOp::kSum, true).ok());
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(views[2 * r]->f()[i], ranks_sum + kRanks * static_cast<float>(i)) << r << " " << i;
    }
  }
  // AllReduce out of place, average: the inputs stay, every output is the mean.
  fill(1);
  ASSERT_TRUE(run(scheduler::OpKind::kAllReduce, RedOp::kAvg, false).ok());
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(views[2 * r]->f()[5], static_cast<float>(r) + 5.0f);
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(views[2 * r + 1]->f()[i], ranks_sum / kRanks + static_cast<float>(i)) << r;
    }
  }
  // ReduceScatter in place (each rank's result is its own block of its input), max.
  fill(kRanks);
  ASSERT_TRUE(run(scheduler::OpKind::kReduceScatter, RedOp::kMax, true).ok());
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(views[2 * r]->f()[r * kCount + i], (kRanks - 1.0f) + static_cast<float>(i)) << r;
    }
  }
}

// Ranks on two devices in one operation: the reduce is split between the devices (each its
// slice of the elements, into every destination) when they are peers; without peer access the
// step is refused, saying which device cannot reach which, and nothing runs.
TEST(FakeDeviceRuntimeTest, AnOperationOverRanksOnTwoDevicesNeedsPeerAccess) {
  for (const bool peers : {true, false}) {
    FakeDeviceRuntime rt(2, peers);
    constexpr int kRanks = 4;
    constexpr size_t kCount = 1000;
    std::vector<std::unique_ptr<HostView>> views;
    std::vector<std::shared_ptr<DeviceMapping>> maps;
    std::vector<scheduler::RankRequest> reqs(kRanks);
    std::vector<const scheduler::RankRequest*> ptrs;
    for (int r = 0; r < kRanks; ++r) {
      absl::StatusOr<UniqueFd> fd = FakeDeviceRuntime::Allocate(r % 2, kCount * 4);
      ASSERT_TRUE(fd.ok());
      views.push_back(std::make_unique<HostView>(fd->get(), kCount * 4));
      absl::StatusOr<std::shared_ptr<DeviceMapping>> m =
          rt.Import(r % 2, *std::move(fd), kCount * 4);
      ASSERT_TRUE(m.ok()) << m.status();
      maps.push_back(*m);
      EXPECT_EQ(rt.DeviceOf(maps.back()->data() + 17), r % 2);
      for (size_t i = 0; i < kCount; ++i) views[r]->f()[i] = static_cast<float>(r + i);
      scheduler::RankRequest& q = reqs[r];
      q.op = scheduler::OpKind::kAllReduce;
      q.count = kCount;
      q.device = r % 2;
      q.send = q.recv = maps[r]->data();
      ptrs.push_back(&q);
    }
    EXPECT_EQ(rt.DeviceOf(views[0]->p), -1);  // host memory
    scheduler::LocalPlan plan;
    scheduler::BuildLocalPlan(ptrs, scheduler::kDefaultChunkBytes, &plan);
    const absl::Status s = scheduler::RunDeviceSteps(plan, &rt);
    if (!peers) {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_NE(s.message().find("cannot reach memory of device"), std::string::npos) << s;
      EXPECT_NE(s.message().find("(no peer access between them)"), std::string::npos) << s;
      EXPECT_EQ(rt.steps(), 0u);
      EXPECT_EQ(views[1]->f()[3], 4.0f);  // untouched
      continue;
    }
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(rt.steps(), 2u);  // one launch per device, each on its slice
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(views[r]->f()[i], 6.0f + kRanks * static_cast<float>(i)) << r << " " << i;
      }
    }
  }
}

// Waiting for a GPU holds no worker: a device plan runs on its device's thread, so a host plan
// of another job goes through the one worker while the device's stream is still busy.
class SlowStreamRuntime : public FakeDeviceRuntime {
 public:
  using FakeDeviceRuntime::FakeDeviceRuntime;
  absl::Status Synchronize(int device) override {
    for (int i = 0; i < 10000 && !finish.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return FakeDeviceRuntime::Synchronize(device);
  }
  std::atomic<bool> finish{false};
};

TEST(ExecutorDeviceTest, WaitingForAGpuHoldsNoWorker) {
  SlowStreamRuntime rt(1);
  scheduler::Executor executor(1);
  executor.SetDeviceRuntime(&rt);
  absl::StatusOr<UniqueFd> fa = FakeDeviceRuntime::Allocate(0, 4096);
  absl::StatusOr<UniqueFd> fb = FakeDeviceRuntime::Allocate(0, 4096);
  ASSERT_TRUE(fa.ok() && fb.ok());
  auto a = rt.Import(0, *std::move(fa), 4096);
  auto b = rt.Import(0, *std::move(fb), 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  std::atomic<bool> device_done{false}, host_done{false};
  scheduler::Execution on_device;
  scheduler::BuildCopyPlan((*a)->data(), (*b)->data(), 4096, scheduler::kDefaultChunkBytes,
                           &on_device.plan, 0);
  on_device.on_done = [&] { device_done = true; };
  executor.Run(&on_device);
  std::vector<std::byte> src(1 << 20, std::byte{7}), dst(1 << 20);
  scheduler::Execution on_host;
  scheduler::BuildCopyPlan(src.data(), dst.data(), src.size(), scheduler::kDefaultChunkBytes,
                           &on_host.plan);
  on_host.on_done = [&] { host_done = true; };
  executor.Run(&on_host);
  for (int i = 0; i < 5000 && !host_done.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(host_done.load());
  EXPECT_FALSE(device_done.load());  // its stream is still "busy"
  EXPECT_EQ(dst[12345], std::byte{7});
  rt.finish = true;
  for (int i = 0; i < 5000 && !device_done.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(device_done.load());
  EXPECT_TRUE(on_device.status.ok()) << on_device.status;
}

TEST(FakeDeviceRuntimeTest, TheDeviceAddressIsNotHostMemory) {
  FakeDeviceRuntime rt(1);
  absl::StatusOr<UniqueFd> fd = FakeDeviceRuntime::Allocate(0, 4096);
  ASSERT_TRUE(fd.ok());
  absl::StatusOr<std::shared_ptr<DeviceMapping>> m = rt.Import(0, *std::move(fd), 4096);
  ASSERT_TRUE(m.ok());
  std::byte* p = (*m)->data();
  EXPECT_DEATH({ std::memset(p, 1, 1); }, "");
}

// At shutdown a session's buffers may be released after the daemon's runtime is gone.
TEST(FakeDeviceRuntimeTest, AMappingMayOutliveItsRuntime) {
  auto rt = std::make_unique<FakeDeviceRuntime>(1);
  absl::StatusOr<UniqueFd> fd = FakeDeviceRuntime::Allocate(0, 8192);
  ASSERT_TRUE(fd.ok());
  absl::StatusOr<std::shared_ptr<DeviceMapping>> m = rt->Import(0, *std::move(fd), 8192);
  ASSERT_TRUE(m.ok());
  rt.reset();
  EXPECT_EQ((*m)->size(), 8192u);
  m->reset();  // unmaps and forgets it without the runtime (ASan would see a use after free)
}

TEST(OpenDeviceRuntimeTest, SaysWhyThereIsNoneOrCountsDevices) {
  absl::StatusOr<std::unique_ptr<DeviceRuntime>> rt = OpenDeviceRuntime();
  if (rt.ok()) {
    EXPECT_GE((*rt)->DeviceCount(), 0);
    EXPECT_NE((*rt)->Describe().find("device(s)"), std::string::npos);
    GTEST_SKIP() << "this node has a CUDA driver: " << (*rt)->Describe();
  }
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kFailedPrecondition) << rt.status();
  EXPECT_NE(rt.status().message().find("host memory only"), std::string::npos) << rt.status();
}

}  // namespace
}  // namespace railyard::device
