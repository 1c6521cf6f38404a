// Fakes for the daemon's seams, for unit tests without processes: a clock that moves only when
// told, and a completion sink that records what a communicator delivers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/session/completion_sink.h"
#include "daemon/util/clock.h"

namespace railyard::testing {

class FakeClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'000'000'000);
};

struct Completion {
  absl::Status status;
  uint64_t seq = 0;
};

// Records completions by request id; Wait blocks (bounded, real time) until one arrives.
class RecordingSink final : public CompletionSink {
 public:
  void PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) override {
    absl::MutexLock lock(&mu_);
    done_[request_id].push_back({status, seq});
  }
  // The completion of request_id, or a DEADLINE_EXCEEDED placeholder after `limit`.
  Completion Wait(uint64_t request_id, absl::Duration limit = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto arrived = [this, request_id]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_.count(request_id) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&arrived), limit)) {
      return {absl::DeadlineExceededError("test: no completion arrived"), 0};
    }
    return done_[request_id].front();
  }
  // How many completions request_id got (exactly one is the contract).
  size_t Count(uint64_t request_id) {
    absl::MutexLock lock(&mu_);
    auto it = done_.find(request_id);
    return it == done_.end() ? 0 : it->second.size();
  }

 private:
  absl::Mutex mu_;
  std::map<uint64_t, std::vector<Completion>> done_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard::testing
