#include "daemon/transport/bit_flip_endpoint.h"

#include <cstring>
#include <utility>

namespace railyard::transport {

BitFlipEndpoint::BitFlipEndpoint(std::shared_ptr<Endpoint> inner, uint64_t every, uint64_t seed,
                                 size_t protected_tail, std::function<bool(Tag)> spare)
    : inner_(std::move(inner)),
      every_(every == 0 ? 1 : every),
      protected_tail_(protected_tail),
      spare_(std::move(spare)),
      rng_(seed) {}

void BitFlipEndpoint::SendV(Tag tag, const Segment* segments, int count, CompletionFn done) {
  const size_t total = TotalSize(segments, count);
  // A message no longer than the protected tail (a split frame's separate trailer) is not
  // counted: every Nth payload is flipped, whether its trailer travels with it or after it.
  if (total <= protected_tail_ || count < 1 || count > kMaxSegments || (spare_ && spare_(tag))) {
    inner_->SendV(tag, segments, count, std::move(done));
    return;
  }
  const uint64_t n = sent_.fetch_add(1) + 1;
  if (n % every_ != 0) {
    inner_->SendV(tag, segments, count, std::move(done));
    return;
  }
  auto* scratch = new unsigned char[total];
  size_t at = 0;
  for (int i = 0; i < count; ++i) {
    if (segments[i].size > 0) std::memcpy(scratch + at, segments[i].data, segments[i].size);
    at += segments[i].size;
  }
  uint64_t bit;
  {
    absl::MutexLock lock(&mu_);
    bit = std::uniform_int_distribution<uint64_t>(0, (total - protected_tail_) * 8 - 1)(rng_);
  }
  scratch[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  last_bit_.store(bit);
  flipped_.fetch_add(1);
  const Segment flipped{scratch, total};
  inner_->SendV(tag, &flipped, 1, [scratch, done = std::move(done)](absl::Status s) {
    delete[] scratch;
    done(std::move(s));
  });
}

}  // namespace railyard::transport
