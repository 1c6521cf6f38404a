// TEST-ONLY fault injection: an endpoint that flips one random bit in every Nth message it
// sends, as silent data corruption on the wire would. The daemon wraps its UCX endpoints in it
// only with --test_flip_bit_every=N (never set it in production); the tests of the data plane's
// CRC (tests/unit/framed_endpoint_test.cc, tests/integration/multinode_test.cc) use it to show
// that every flipped bit is caught.
//
// It sits under FramedEndpoint, so its messages end with the frame trailer: the bit is drawn in
// the first size - protected_tail bytes (the payload), so a flip is corruption of the data, not
// of the secret. A split frame's payload (FramedEndpoint::Options::split_min_bytes) loses the
// same number of bytes at its end from the draw, which only narrows where the bit lands; its
// separate 16-byte trailer is neither counted nor flipped. The message is copied into scratch
// memory and flipped there, never in the caller's buffer. Messages `spare` says are not data
// (the daemons' operation digests, daemon/comm/op_digest.h, with the small payload one may
// carry) pass untouched and uncounted, so the flips land in what the schedules move.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/transport/transport.h"

namespace railyard::transport {

class BitFlipEndpoint : public Endpoint {
 public:
  // every >= 1: the every-th, 2*every-th, ... message longer than protected_tail sent (counted
  // per endpoint) is flipped.
  BitFlipEndpoint(std::shared_ptr<Endpoint> inner, uint64_t every, uint64_t seed,
                  size_t protected_tail, std::function<bool(Tag)> spare = nullptr);

  void SendV(Tag tag, const Segment* segments, int count, CompletionFn done) override;
  void RecvV(Tag tag, const Segment* segments, int count, RecvCompletionFn done) override {
    inner_->RecvV(tag, segments, count, std::move(done));
  }
  void Abort(const absl::Status& status) override { inner_->Abort(status); }

  // Messages flipped so far, and the bit of the last (offset into the message * 8 + bit).
  uint64_t flipped() const { return flipped_.load(); }
  uint64_t last_bit() const { return last_bit_.load(); }

 private:
  const std::shared_ptr<Endpoint> inner_;
  const uint64_t every_;
  const size_t protected_tail_;
  const std::function<bool(Tag)> spare_;
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> flipped_{0};
  std::atomic<uint64_t> last_bit_{0};
  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard::transport
