#include "client/nccl/nccl_memory.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "client/nccl/nccl_process.h"

namespace railyard::nccl {
namespace {

// Free staging buffers kept for reuse, in bytes, at most.
constexpr size_t kStagingKeptBytes = size_t{1} << 30;

struct Registry {
  absl::Mutex mu;
  // By start address: ncclMemAlloc's and registered device memory.
  std::map<uintptr_t, std::shared_ptr<Buffer>> buffers ABSL_GUARDED_BY(mu);
  std::map<uintptr_t, std::shared_ptr<Buffer>> allocated ABSL_GUARDED_BY(mu);  // ncclMemAlloc's
  std::multimap<size_t, std::unique_ptr<Buffer>> free_staging ABSL_GUARDED_BY(mu);
  size_t free_staging_bytes ABSL_GUARDED_BY(mu) = 0;
};

Registry& R() {
  static Registry* r = new Registry();  // outlives every communicator (never destroyed)
  return *r;
}

bool CudaPresent() {
  static const bool present = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return present;
}

size_t RoundUp(size_t bytes) {
  size_t r = 4096;
  while (r < bytes) r <<= 1;
  return r;
}

}  // namespace

std::string Ptr(const void* p) { return absl::StrFormat("%p", p); }

bool IsDevicePointer(const void* p, int* device) {
  if (!CudaPresent() || p == nullptr) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear it: unregistered host memory is no error here
    return false;
  }
  if (attr.type != cudaMemoryTypeDevice) return false;
  *device = attr.device;
  return true;
}

absl::StatusOr<Resolved> Resolve(const void* p, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  Registry& r = R();
  {
    absl::MutexLock lock(&r.mu);
    auto it = r.buffers.upper_bound(at);
    if (it != r.buffers.begin()) {
      --it;
      const Buffer& b = *it->second;
      if (at < it->first + b.size()) {
        if (at + bytes > it->first + b.size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "buffer ", Ptr(p), " + ", bytes, " bytes runs past the end of the ", b.size(),
              "-byte allocation it starts in (", Ptr(reinterpret_cast<void*>(it->first)), ")"));
        }
        return Resolved{it->second, at - it->first, b.device() >= 0, b.device()};
      }
    }
  }
  int device = -1;
  if (!IsDevicePointer(p, &device)) return Resolved{};
  // Device memory from elsewhere: registered once, as the range asked for.
  absl::StatusOr<Client*> client = ProcessClient();
  if (!client.ok()) return client.status();
  absl::StatusOr<Buffer> reg =
      (*client)->RegisterDevicePointer(const_cast<void*>(p), bytes, device);
  if (!reg.ok()) return reg.status();
  auto held = std::make_shared<Buffer>(std::move(*reg));
  absl::MutexLock lock(&r.mu);
  r.buffers[at] = held;
  return Resolved{held, 0, true, device};
}

absl::StatusOr<void*> MemAlloc(size_t size) {
  absl::StatusOr<Client*> client = ProcessClient();
  if (!client.ok()) return client.status();
  absl::StatusOr<Buffer> b = absl::UnknownError("");
  const char* host = std::getenv("RAILYARD_NCCL_HOST_MEMORY");
  if (CudaPresent() && (host == nullptr || std::string(host) != "1")) {
    int device = 0;
    cudaGetDevice(&device);
    b = (*client)->AllocateDevice(size, device);
  } else {
    b = (*client)->Allocate(size);
  }
  if (!b.ok()) return b.status();
  auto held = std::make_shared<Buffer>(std::move(*b));
  void* p = held->data();
  Registry& r = R();
  absl::MutexLock lock(&r.mu);
  r.buffers[reinterpret_cast<uintptr_t>(p)] = held;
  r.allocated[reinterpret_cast<uintptr_t>(p)] = held;
  return p;
}

absl::Status MemFree(void* p) {
  Registry& r = R();
  std::shared_ptr<Buffer> gone;
  absl::MutexLock lock(&r.mu);
  auto it = r.allocated.find(reinterpret_cast<uintptr_t>(p));
  if (it == r.allocated.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ncclMemFree(", Ptr(p), "): not a pointer ncclMemAlloc returned (or freed twice)"));
  }
  gone = std::move(it->second);
  r.allocated.erase(it);
  r.buffers.erase(reinterpret_cast<uintptr_t>(p));
  // Released (ReleaseBuffer) when the last operation holding it lets go.
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Buffer>> TakeStaging(size_t bytes) {
  Registry& r = R();
  const size_t want = RoundUp(bytes == 0 ? 1 : bytes);
  std::unique_ptr<Buffer> b;
  {
    absl::MutexLock lock(&r.mu);
    auto it = r.free_staging.lower_bound(want);
    if (it != r.free_staging.end() && it->first <= 2 * want) {
      b = std::move(it->second);
      r.free_staging_bytes -= it->first;
      r.free_staging.erase(it);
    }
  }
  if (b == nullptr) {
    absl::StatusOr<Client*> client = ProcessClient();
    if (!client.ok()) return client.status();
    absl::StatusOr<Buffer> made = (*client)->Allocate(want);
    if (!made.ok()) return made.status();
    b = std::make_unique<Buffer>(std::move(*made));
  }
  return std::shared_ptr<Buffer>(b.release(), [](Buffer* back) {
    Registry& reg = R();
    absl::MutexLock lock(&reg.mu);
    if (reg.free_staging_bytes + back->size() > kStagingKeptBytes) {
      // Evict the largest kept ones first, then keep this one if it fits.
      while (!reg.free_staging.empty() &&
             reg.free_staging_bytes + back->size() > kStagingKeptBytes) {
        auto last = std::prev(reg.free_staging.end());
        reg.free_staging_bytes -= last->first;
        reg.free_staging.erase(last);
      }
    }
    if (back->size() > kStagingKeptBytes) {
      delete back;
      return;
    }
    reg.free_staging_bytes += back->size();
    reg.free_staging.emplace(back->size(), std::unique_ptr<Buffer>(back));
  });
}

}  // namespace railyard::nccl
