// Small host allocations carved from larger registered buffers. Each registered buffer is one
// mapping in the daemon, and the daemon gives each job a share of the mappings the kernel allows
// (vm.max_map_count; the daemon's --max_mappings_per_job): a program that allocated thousands of
// small buffers one by one would meet it. Allocations up to kMaxPooled bytes are instead chunks
// of kSlabBytes slabs, one size class (a power of two) per slab; a chunk goes back to its slab
// when its Buffer is destroyed, and slabs live as long as the Client or a chunk of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"

namespace railyard::internal {

class SmallPool {
 public:
  static constexpr size_t kMaxPooled = size_t{256} << 10;
  static constexpr size_t kSlabBytes = size_t{4} << 20;
  static constexpr size_t kMinChunk = 256;

  // A new registered slab of `size` bytes: its buffer id and where it is mapped here, and an
  // owner that releases it (ReleaseBuffer, munmap) when the last chunk and the pool let go.
  struct Slab {
    uint64_t buffer_id = 0;
    std::byte* data = nullptr;
    std::shared_ptr<void> owner;
  };
  using SlabAllocator = std::function<absl::StatusOr<Slab>(size_t size)>;

  struct Chunk {
    uint64_t buffer_id = 0;  // the slab's
    std::byte* data = nullptr;
    size_t offset = 0;            // in the slab
    std::shared_ptr<void> lease;  // gives the chunk back when it goes
  };

  explicit SmallPool(SlabAllocator allocate);

  // Whether Take serves `size` bytes.
  static bool Pooled(size_t size) { return size > 0 && size <= kMaxPooled; }
  // A chunk of at least `size` bytes (1 <= size <= kMaxPooled), aligned to its size class.
  absl::StatusOr<Chunk> Take(size_t size);

  // Slabs registered so far (tests).
  size_t slabs() const;

 private:
  struct SlabState {
    Slab slab;
    size_t chunk = 0;
    std::vector<size_t> free;  // offsets
  };
  struct State {
    mutable std::mutex mu;
    std::vector<std::shared_ptr<SlabState>> slabs;
  };
  static size_t ClassOf(size_t size);

  SlabAllocator allocate_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace railyard::internal
