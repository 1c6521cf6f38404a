// Where the library finds railyard buffers for the pointers NCCL calls pass:
//  - ncclMemAlloc's memory (host memory shared with the daemon where there is no GPU, else device
//    memory on the current device): used in place, no copy;
//  - device memory allocated elsewhere (cudaMalloc, a framework's): registered with the daemon on
//    first use (Client::RegisterDevicePointer) and kept;
//  - any other host memory: staged, i.e. copied into a pooled shared buffer before the operation
//    and out of it after (StagingPool), the price of memory the daemon cannot map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "railyard/client.h"

namespace railyard::nccl {

// A railyard buffer region that holds [p, p + bytes): the buffer stays registered while held.
struct Resolved {
  std::shared_ptr<const Buffer> buffer;
  size_t offset = 0;
  bool device = false;
  int cuda_device = -1;
};

// Memory of ncclMemAlloc (or registered device memory) that holds [p, p + bytes); null buffer
// when p is plain host memory (to be staged). INVALID_ARGUMENT for a range that starts in such
// memory and runs past its end.
absl::StatusOr<Resolved> Resolve(const void* p, size_t bytes);

absl::StatusOr<void*> MemAlloc(size_t size);
// INVALID_ARGUMENT for a pointer MemAlloc did not return.
absl::Status MemFree(void* p);

// True when p is CUDA device memory (device set); false for host memory or without CUDA.
bool IsDevicePointer(const void* p, int* device);

// A pointer as messages print it (0x...).
std::string Ptr(const void* p);

// Pooled host buffers for staging: Take returns one of at least `bytes`, given back to the pool
// (up to a bounded amount kept) when the last reference goes.
absl::StatusOr<std::shared_ptr<Buffer>> TakeStaging(size_t bytes);

}  // namespace railyard::nccl
