// POSIX shared-memory segments that the client creates and the daemon maps (docs/local-api.md,
// "Buffers"). Only the mapping survives: the name is unlinked as soon as the daemon has mapped it.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace railyard::internal {

// A mapping of a freshly created segment whose name is still linked in /dev/shm.
struct ShmSegment {
  std::string name;  // "/railyard.<job>.<pid>.<n>.<16 hex>", as passed to shm_open
  void* data = nullptr;
  size_t size = 0;
};

// Creates (O_CREAT|O_EXCL, mode 0600), sizes and maps (MAP_SHARED|MAP_POPULATE) a new segment.
// The file descriptor is closed before returning; the mapping keeps the segment alive.
// Errors: INVALID_ARGUMENT for size 0, RESOURCE_EXHAUSTED when /dev/shm or memory is full,
// INTERNAL for any other system error.
absl::StatusOr<ShmSegment> CreateShmSegment(const std::string& job, uint64_t serial, size_t size);

// Removes the segment's name (the mappings stay valid). Idempotent; errors are ignored.
void UnlinkShmSegment(const ShmSegment& segment);

// Unmaps a mapping made by CreateShmSegment.
void UnmapShm(void* data, size_t size);

// strerror() without its static buffer (thread-safe).
std::string ErrnoText(int err);

}  // namespace railyard::internal
