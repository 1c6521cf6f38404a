// The memory of a client buffer: a memfd (never a name in /dev/shm) that is sized, allocated,
// sealed against shrinking and growing, and mapped here; its descriptor then goes to the daemon
// over the side channel (fd_channel_client.h) and is closed (docs/local-api.md, "Buffers").
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace railyard::internal {

struct MemfdBuffer {
  int fd = -1;  // owned until CloseMemfd; the mapping keeps the memory alive after
  void* data = nullptr;
  size_t size = 0;
};

// memfd_create(MFD_CLOEXEC | MFD_ALLOW_SEALING) named "railyard.<job>", fallocate(size),
// F_ADD_SEALS(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), mmap(MAP_SHARED | MAP_POPULATE).
// Errors: INVALID_ARGUMENT for size 0, RESOURCE_EXHAUSTED when memory (or the cgroup's share)
// is full, INTERNAL for any other system error.
absl::StatusOr<MemfdBuffer> CreateMemfdBuffer(const std::string& job, size_t size);

// Closes the descriptor (the mapping stays valid). Idempotent.
void CloseMemfd(MemfdBuffer* buffer);

// Unmaps a mapping made by CreateMemfdBuffer.
void UnmapBuffer(void* data, size_t size);

// strerror() without its static buffer (thread-safe).
std::string ErrnoText(int err);

}  // namespace railyard::internal
