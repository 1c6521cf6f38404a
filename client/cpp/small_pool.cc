#include "small_pool.h"

#include <bit>
#include <utility>

namespace railyard::internal {

SmallPool::SmallPool(SlabAllocator allocate) : allocate_(std::move(allocate)) {}

size_t SmallPool::ClassOf(size_t size) { return std::bit_ceil(std::max(size, kMinChunk)); }

size_t SmallPool::slabs() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->slabs.size();
}

absl::StatusOr<SmallPool::Chunk> SmallPool::Take(size_t size) {
  const size_t chunk = ClassOf(size);
  std::shared_ptr<SlabState> from;
  size_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (const auto& s : state_->slabs) {
      if (s->chunk == chunk && !s->free.empty()) {
        from = s;
        offset = s->free.back();
        s->free.pop_back();
        break;
      }
    }
  }
  if (from == nullptr) {
    // Registered outside the lock: it is a round trip to the daemon.
    absl::StatusOr<Slab> slab = allocate_(kSlabBytes);
    if (!slab.ok()) return slab.status();
    auto s = std::make_shared<SlabState>();
    s->slab = *std::move(slab);
    s->chunk = chunk;
    for (size_t off = kSlabBytes; off >= 2 * chunk; off -= chunk) s->free.push_back(off - chunk);
    from = s;
    offset = 0;  // the first chunk is this caller's
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->slabs.push_back(std::move(s));
  }
  Chunk c;
  c.buffer_id = from->slab.buffer_id;
  c.data = from->slab.data + offset;
  c.offset = offset;
  std::weak_ptr<State> state = state_;
  // The lease keeps the slab mapped while the chunk lives, and gives the offset back after.
  c.lease = std::shared_ptr<void>(from.get(), [from, offset, state](void*) {
    if (std::shared_ptr<State> st = state.lock()) {
      std::lock_guard<std::mutex> lock(st->mu);
      from->free.push_back(offset);
    }
  });
  return c;
}

}  // namespace railyard::internal
