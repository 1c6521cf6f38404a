// The CUDA side on a real GPU (built when nvcc is found; every test skips, saying why, when this
// node has no usable device): the reduce kernels against the CPU kernels for every dtype x op,
// in both widths (16-byte vectors and single elements), into one and many destinations and in
// place; device memory a client allocates (railyard/device_memory.h), exported as a descriptor
// and imported by the daemon's runtime; and what the runtime refuses.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "daemon/device/device_runtime.h"
#include "daemon/kernels/cuda/reduce_cuda.h"
#include "daemon/kernels/reduce.h"
#include "railyard/device_memory.h"
#include "tests/cuda/no_gpu.h"

namespace railyard {
namespace {

using kernels::DataType;
using kernels::RedOp;
using testing::NoGpu;

constexpr DataType kAllTypes[] = {
    DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
    DataType::kInt8,    DataType::kUint8,   DataType::kInt32,   DataType::kUint32,
    DataType::kInt64,   DataType::kUint64,
};
constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax, RedOp::kAvg};

#define REQUIRE_GPU()                      \
  do {                                     \
    const std::string why = NoGpu();       \
    if (!why.empty()) GTEST_SKIP() << why; \
  } while (0)

// Values every op keeps finite and exact enough to compare bit for bit with the CPU kernels
// (both accumulate in the same type, in the same order).
void Fill(DataType t, std::byte* p, size_t count, std::mt19937* rng) {
  const size_t es = kernels::ElementSize(t);
  std::uniform_int_distribution<int> small(-4, 4);
  for (size_t i = 0; i < count; ++i) {
    const float v = static_cast<float>(small(*rng)) * 0.5f;
    switch (t) {
      case DataType::kFloat32:
        std::memcpy(p + i * es, &v, 4);
        break;
      case DataType::kFloat64: {
        const double d = v;
        std::memcpy(p + i * es, &d, 8);
        break;
      }
      case DataType::kFloat16: {
        const uint16_t h = kernels::FloatToHalf(v);
        std::memcpy(p + i * es, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t b = kernels::FloatToBFloat16(v);
        std::memcpy(p + i * es, &b, 2);
        break;
      }
      default:
        for (size_t b = 0; b < es; ++b) p[i * es + b] = static_cast<std::byte>((*rng)());
    }
  }
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&p_, bytes == 0 ? 1 : bytes), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  std::byte* get() const { return static_cast<std::byte*>(p_); }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

// Runs one (dtype, op, nsrcs, ndsts, count, misalignment) case on the GPU and on the CPU and
// compares the bytes of every destination.
void CheckCase(DataType t, RedOp op, int nsrcs, int ndsts, size_t count, size_t skew, bool in_place,
               std::mt19937* rng) {
  const size_t es = kernels::ElementSize(t);
  const size_t bytes = (count + skew) * es;
  std::vector<std::vector<std::byte>> host(nsrcs, std::vector<std::byte>(bytes));
  std::vector<std::unique_ptr<DeviceBuffer>> dsrc, ddst;
  std::vector<const void*> srcs, hsrcs;
  std::vector<void*> dsts;
  for (int s = 0; s < nsrcs; ++s) {
    Fill(t, host[s].data(), count + skew, rng);
    dsrc.push_back(std::make_unique<DeviceBuffer>(bytes));
    ASSERT_EQ(cudaMemcpy(dsrc[s]->get(), host[s].data(), bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
    srcs.push_back(dsrc[s]->get() + skew * es);
    hsrcs.push_back(host[s].data() + skew * es);
  }
  for (int d = 0; d < ndsts; ++d) {
    if (in_place && d == 0) {
      dsts.push_back(dsrc[0]->get() + skew * es);
      continue;
    }
    ddst.push_back(std::make_unique<DeviceBuffer>(bytes));
    dsts.push_back(ddst.back()->get() + skew * es);
  }
  std::vector<std::byte> want(count * es);
  void* want_p = want.data();
  kernels::ReduceToMany(t, op, &want_p, 1, hsrcs.data(), nsrcs, count, nsrcs);
  ASSERT_EQ(railyard_cuda_reduce_to_many(static_cast<int>(t), static_cast<int>(op), dsts.data(),
                                         ndsts, srcs.data(), nsrcs, count, nsrcs, nullptr),
            0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<std::byte> got(count * es);
  for (int d = 0; d < ndsts; ++d) {
    ASSERT_EQ(cudaMemcpy(got.data(), dsts[d], count * es, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), count * es), 0)
        << kernels::Name(t) << " " << kernels::Name(op) << " nsrcs " << nsrcs << " ndsts " << ndsts
        << " count " << count << " skew " << skew << " dst " << d;
  }
}

TEST(CudaReduceTest, EveryTypeAndOpMatchesTheCpuKernels) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  for (DataType t : kAllTypes) {
    for (RedOp op : kAllOps) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{4099}, size_t{(1 << 20) + 3}}) {
        CheckCase(t, op, 3, 1, count, 0, false, &rng);
        CheckCase(t, op, 2, 3, count, 1, false, &rng);  // unaligned: the single-element kernel
      }
      CheckCase(t, op, 1, 1, 1000, 0, false, &rng);
      CheckCase(t, op, 8, 2, 5000, 0, true, &rng);
    }
  }
}

TEST(CudaReduceTest, BadArgumentsAreRefusedNotLaunched) {
  REQUIRE_GPU();
  DeviceBuffer a(64);
  const void* srcs[] = {a.get()};
  void* dsts[] = {a.get()};
  EXPECT_NE(railyard_cuda_reduce_to_many(10, 0, dsts, 1, srcs, 1, 4, 1, nullptr), 0);
  EXPECT_NE(railyard_cuda_reduce_to_many(0, 5, dsts, 1, srcs, 1, 4, 1, nullptr), 0);
  EXPECT_NE(railyard_cuda_reduce_to_many(0, 0, dsts, 1, srcs, 0, 4, 1, nullptr), 0);
  EXPECT_NE(railyard_cuda_reduce_to_many(0, 0, dsts, 0, srcs, 1, 4, 1, nullptr), 0);
  const void* null_src[] = {nullptr};
  EXPECT_NE(railyard_cuda_reduce_to_many(0, 0, dsts, 1, null_src, 1, 4, 1, nullptr), 0);
}

TEST(CudaDeviceRuntimeTest, ImportsExportedDeviceMemoryAndRunsStepsOnIt) {
  REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<device::DeviceRuntime>> rt = device::OpenDeviceRuntime();
  ASSERT_TRUE(rt.ok()) << rt.status();
  constexpr size_t kCount = 3 << 20;
  constexpr size_t kBytes = kCount * sizeof(float);
  std::vector<DeviceMemory> mem;
  std::vector<std::shared_ptr<device::DeviceMapping>> maps;
  for (int k = 0; k < 3; ++k) {
    absl::StatusOr<DeviceMemory> m = DeviceMemory::Allocate(kBytes, 0);
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<int> fd = m->ExportFd();
    ASSERT_TRUE(fd.ok()) << fd.status();
    absl::StatusOr<std::shared_ptr<device::DeviceMapping>> map =
        (*rt)->Import(0, UniqueFd(*fd), kBytes);
    ASSERT_TRUE(map.ok()) << map.status();
    mem.push_back(*std::move(m));
    maps.push_back(*map);
  }
  std::vector<float> a(kCount), b(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    a[i] = static_cast<float>(i % 1000);
    b[i] = 1.0f;
  }
  ASSERT_EQ(cudaMemcpy(mem[0].data(), a.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(mem[1].data(), b.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  void* dsts[] = {maps[2]->data(), maps[0]->data()};
  const void* srcs[] = {maps[0]->data(), maps[1]->data()};
  ASSERT_TRUE(
      (*rt)->ReduceToMany(0, DataType::kFloat32, RedOp::kSum, dsts, 2, srcs, 2, kCount, 1).ok());
  ASSERT_TRUE((*rt)->Copy(0, maps[1]->data(), maps[2]->data(), kBytes).ok());
  ASSERT_TRUE((*rt)->Synchronize(0).ok());
  std::vector<float> got(kCount);
  for (int k = 0; k < 3; ++k) {
    // Read through the client's own mapping: the daemon's wrote the same memory.
    ASSERT_EQ(cudaMemcpy(got.data(), mem[k].data(), kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < kCount; i += 4097) ASSERT_EQ(got[i], a[i] + 1.0f) << k << " " << i;
  }

  // More than was allocated, a device it does not have, a descriptor that is not device memory.
  absl::StatusOr<int> fd = mem[0].ExportFd();
  ASSERT_TRUE(fd.ok());
  absl::Status s = (*rt)->Import(0, UniqueFd(*fd), mem[0].allocated() + 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  fd = mem[0].ExportFd();
  s = (*rt)->Import((*rt)->DeviceCount(), UniqueFd(*fd), kBytes).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  if ((*rt)->DeviceCount() > 1) {
    fd = mem[0].ExportFd();
    s = (*rt)->Import(1, UniqueFd(*fd), kBytes).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("lives on device 0, not on device 1"), std::string::npos) << s;
  }
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  s = (*rt)->Import(0, UniqueFd(pipe_fds[0]), kBytes).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("not an exported device allocation"), std::string::npos) << s;
}

// Without a GPU this is the test that runs: both ends say why there is no device memory.
TEST(CudaDeviceRuntimeTest, WithoutAUsableDriverBothEndsSayWhy) {
  const std::string why = NoGpu();
  if (why.empty()) GTEST_SKIP() << "this node has a GPU";
  absl::StatusOr<std::unique_ptr<device::DeviceRuntime>> rt = device::OpenDeviceRuntime();
  if (rt.ok()) {
    EXPECT_EQ((*rt)->DeviceCount(), 0);  // a driver without devices
  } else {
    EXPECT_EQ(rt.status().code(), absl::StatusCode::kFailedPrecondition) << rt.status();
    EXPECT_NE(rt.status().message().find("cudaGetDeviceCount"), std::string::npos) << rt.status();
  }
  absl::StatusOr<DeviceMemory> m = DeviceMemory::Allocate(4096, 0);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(m.status().code() == absl::StatusCode::kFailedPrecondition ||
              m.status().code() == absl::StatusCode::kInvalidArgument)
      << m.status();
}

}  // namespace
}  // namespace railyard
