#include "daemon/device/staging_pool.h"

#include <algorithm>
#include <utility>

#include "absl/numeric/bits.h"
#include "absl/strings/str_cat.h"

namespace railyard::device {

namespace {
constexpr uint64_t kMinClass = 64 << 10;
// Past this no class is computed (rounding up could wrap) and nothing is allocated.
constexpr uint64_t kMaxBytes = uint64_t{1} << 62;
}  // namespace

uint64_t StagingPool::ClassOf(uint64_t bytes) {
  if (bytes <= kMinClass) return kMinClass;
  if (bytes > kMaxBytes) return bytes;
  // Four classes per doubling: round up to a multiple of a quarter of the power of two below.
  const int width = absl::bit_width(bytes - 1);  // 2^(width-1) < bytes <= 2^width
  const uint64_t step = uint64_t{1} << (width - 3);
  return (bytes + step - 1) / step * step;
}

StagingPool::StagingPool(DeviceRuntime* devices, uint64_t max_idle_bytes)
    : devices_(devices), state_(std::make_shared<State>()) {
  state_->max_idle_bytes = max_idle_bytes;
}

absl::StatusOr<StagingPool::Lease> StagingPool::Take(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot stage 0 bytes");
  if (bytes > kMaxBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("staging ", bytes, " bytes of device memory in host memory: too large"));
  }
  const uint64_t cls = ClassOf(bytes);
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->idle.find(cls);
    if (it != state_->idle.end() && !it->second.empty()) {
      std::unique_ptr<PinnedHostMemory> buffer = std::move(it->second.back());
      it->second.pop_back();
      if (it->second.empty()) state_->idle.erase(it);
      state_->stats.idle_bytes -= cls;
      state_->stats.idle_buffers -= 1;
      state_->stats.leased_bytes += cls;
      state_->stats.reuses += 1;
      return Lease(state_, std::move(buffer));
    }
  }
  absl::StatusOr<std::unique_ptr<PinnedHostMemory>> buffer = devices_->AllocatePinned(cls);
  if (!buffer.ok()) {
    return absl::Status(buffer.status().code(),
                        absl::StrCat("staging ", bytes, " bytes of device memory in host memory: ",
                                     buffer.status().message()));
  }
  absl::MutexLock lock(&state_->mu);
  state_->stats.allocations += 1;
  state_->stats.leased_bytes += cls;
  return Lease(state_, *std::move(buffer));
}

StagingPool::Stats StagingPool::stats() const {
  absl::MutexLock lock(&state_->mu);
  return state_->stats;
}

StagingPool::Lease& StagingPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Return();
    pool_ = std::move(other.pool_);
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

void StagingPool::Lease::Return() {
  if (buffer_ == nullptr) return;
  std::shared_ptr<State> state = pool_.lock();
  pool_.reset();
  if (state == nullptr) {
    buffer_.reset();
    return;
  }
  // Freed outside the lock: freeing page-locked memory can take a while (cudaFreeHost syncs).
  std::vector<std::unique_ptr<PinnedHostMemory>> freed;
  {
    absl::MutexLock lock(&state->mu);
    const uint64_t cls = buffer_->size();
    state->stats.leased_bytes -= cls;
    if (cls > state->max_idle_bytes) {
      freed.push_back(std::move(buffer_));
    } else {
      // Room for it: the largest idle buffers go first.
      while (state->stats.idle_bytes + cls > state->max_idle_bytes) {
        auto largest = std::prev(state->idle.end());
        freed.push_back(std::move(largest->second.back()));
        largest->second.pop_back();
        state->stats.idle_bytes -= largest->first;
        state->stats.idle_buffers -= 1;
        if (largest->second.empty()) state->idle.erase(largest);
      }
      state->idle[cls].push_back(std::move(buffer_));
      state->stats.idle_bytes += cls;
      state->stats.idle_buffers += 1;
    }
  }
}

}  // namespace railyard::device
