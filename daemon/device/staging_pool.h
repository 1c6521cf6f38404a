// Page-locked host buffers for staging device memory across nodes (daemon/submit/device_staging.h),
// kept for reuse: a training loop stages the same sizes every step, and a fresh buffer costs
// the allocation, the page-locking and a fault per page (~11 us each on a VM) every time.
//
// Sizes are rounded up to classes, four per doubling from 64 KiB (at most 25% more than asked),
// and a buffer goes back to the idle list of its class when its lease ends. The idle buffers
// together hold at most max_idle_bytes: past it, the largest idle ones are freed (first among
// them: the one just returned, when it alone is larger than the bound). 0 keeps nothing.
//
// A buffer may serve one tenant's operation after another's: the staging code copies back to the
// device only regions that were copied in whole from it or written whole by a successful
// operation, and nothing after a failure, so no byte of a previous lease reaches anyone's device
// memory (daemon/comm/device_staging.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/device/device_runtime.h"

namespace railyard::device {

class StagingPool {
 public:
  struct Stats {
    uint64_t idle_bytes = 0;
    uint64_t idle_buffers = 0;
    uint64_t leased_bytes = 0;  // capacity of the buffers out on lease
    uint64_t allocations = 0;   // buffers allocated (AllocatePinned calls that succeeded)
    uint64_t reuses = 0;        // leases served from the idle list
  };

 private:
  struct State {
    absl::Mutex mu;
    uint64_t max_idle_bytes;
    std::map<uint64_t, std::vector<std::unique_ptr<PinnedHostMemory>>> idle ABSL_GUARDED_BY(mu);
    Stats stats ABSL_GUARDED_BY(mu);
  };

 public:
  // A buffer of at least the bytes asked for; back to the pool (or freed, when the pool is gone
  // or full) on destruction. Move-only.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&&) = default;
    Lease& operator=(Lease&& other) noexcept;
    ~Lease() { Return(); }
    std::byte* data() const { return buffer_ != nullptr ? buffer_->data() : nullptr; }
    uint64_t capacity() const { return buffer_ != nullptr ? buffer_->size() : 0; }

   private:
    friend class StagingPool;
    Lease(std::weak_ptr<State> pool, std::unique_ptr<PinnedHostMemory> buffer)
        : pool_(std::move(pool)), buffer_(std::move(buffer)) {}
    void Return();
    std::weak_ptr<State> pool_;
    std::unique_ptr<PinnedHostMemory> buffer_;
  };

  // devices allocates the buffers; it must outlive the pool (leases may outlive both: a buffer
  // frees itself).
  StagingPool(DeviceRuntime* devices, uint64_t max_idle_bytes);

  // A buffer of at least `bytes` (> 0): an idle one of its class, or a new one
  // (RESOURCE_EXHAUSTED when the runtime cannot allocate it).
  absl::StatusOr<Lease> Take(uint64_t bytes);

  Stats stats() const;
  // The capacity a request for `bytes` gets (bytes itself past 2^62, which Take refuses).
  static uint64_t ClassOf(uint64_t bytes);

 private:
  DeviceRuntime* const devices_;
  const std::shared_ptr<State> state_;
};

}  // namespace railyard::device
