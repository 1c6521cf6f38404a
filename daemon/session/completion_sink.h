// Where a communicator delivers a rank's completions: the rank's Session (its Connect stream) in
// the daemon, a recorder in unit tests.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace railyard {

class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // Called once per accepted request, from any thread, never under a communicator's lock.
  virtual void PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) = 0;
};

}  // namespace railyard
