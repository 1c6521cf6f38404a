// cuda-bench: on one GPU, device memcpy bandwidth and the reduce kernels' (daemon/kernels/cuda)
// at each size, medians of --iters timed launches (CUDA events), one row per size:
//
//   bytes  copy_GB/s  reduce2_GB/s  reduce2/copy  reduce4_GB/s  reduce4/copy
//
// Bandwidths are memory traffic per second (bytes read + bytes written): a copy of M bytes moves
// 2M, a reduce of k inputs into one output (k + 1)M. Their ratio is how close the kernel comes
// to what the memory system gives a copy (issue 16's target: >= 0.9 at >= 64 MiB). The last line
// prints the copy bandwidth at 64 MiB again as "memcpy_GBps_64MiB <x>" for scripts.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/kernels/cuda/reduce_cuda.h"

namespace {

#define CHECK_CUDA(call)                                                           \
  do {                                                                             \
    const cudaError_t e_ = (call);                                                 \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "cuda-bench: %s: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                \
    }                                                                              \
  } while (0)

template <typename F>
double MedianSeconds(int iters, F&& launch) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  launch();  // warm-up
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    launch();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0;
  int iters = 20;
  size_t max_bytes = size_t{256} << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--device=", 0) == 0) {
      device = std::atoi(a.c_str() + 9);
    } else if (a.rfind("--iters=", 0) == 0) {
      iters = std::max(1, std::atoi(a.c_str() + 8));
    } else if (a.rfind("--max_mib=", 0) == 0) {
      max_bytes = static_cast<size_t>(std::max(1, std::atoi(a.c_str() + 10))) << 20;
    } else {
      std::fprintf(stderr, "usage: cuda-bench [--device=N] [--iters=N] [--max_mib=N]\n");
      return 1;
    }
  }
  CHECK_CUDA(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("# cuda-bench on device %d: %s, %d SMs, %.1f GiB\n", device, prop.name,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
  std::printf("# GB/s = (bytes read + bytes written) / median time of %d launches\n", iters);
  std::printf("%12s %11s %13s %13s %13s %13s\n", "bytes", "copy_GB/s", "reduce2_GB/s",
              "reduce2/copy", "reduce4_GB/s", "reduce4/copy");
  std::vector<void*> buf(5, nullptr);
  for (void*& p : buf) CHECK_CUDA(cudaMalloc(&p, max_bytes));
  for (void* p : buf) CHECK_CUDA(cudaMemset(p, 0, max_bytes));
  double copy_64 = 0;
  for (size_t bytes = size_t{1} << 20; bytes <= max_bytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    const double copy = MedianSeconds(iters, [&] {
      CHECK_CUDA(cudaMemcpyAsync(buf[0], buf[1], bytes, cudaMemcpyDeviceToDevice, nullptr));
    });
    auto reduce = [&](int k) {
      const void* srcs[4] = {buf[1], buf[2], buf[3], buf[4]};
      void* dst = buf[0];
      return MedianSeconds(iters, [&] {
        const int e = railyard_cuda_reduce_to_many(0 /* float32 */, 0 /* sum */, &dst, 1, srcs, k,
                                                   count, 1, nullptr);
        if (e != 0) {
          std::fprintf(stderr, "cuda-bench: reduce: %s\n", railyard_cuda_error_string(e));
          std::exit(2);
        }
      });
    };
    const double r2 = reduce(2);
    const double r4 = reduce(4);
    const double copy_bw = 2.0 * bytes / copy / 1e9;
    const double r2_bw = 3.0 * bytes / r2 / 1e9;
    const double r4_bw = 5.0 * bytes / r4 / 1e9;
    if (bytes == (size_t{64} << 20)) copy_64 = copy_bw;
    std::printf("%12zu %11.1f %13.1f %13.3f %13.1f %13.3f\n", bytes, copy_bw, r2_bw,
                r2_bw / copy_bw, r4_bw, r4_bw / copy_bw);
  }
  if (copy_64 > 0) std::printf("memcpy_GBps_64MiB %.1f\n", copy_64);
  for (void* p : buf) cudaFree(p);
  return 0;
}
