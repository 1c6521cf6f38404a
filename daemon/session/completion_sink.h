// Where a communicator delivers a rank's completions: the rank's Session (its Connect stream) in
// the daemon, a recorder in unit tests.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace railyard {

// A request handed back untaken while the daemon hands its node over (railyardd --takeover): not
// an outcome. UNAVAILABLE, marked so that the sinks set COMPLETION_MOVED (local.proto) and a
// client that knows it submits the request again to the daemon that takes over.
inline constexpr char kMovedPayload[] = "railyard.dev/moved";
inline absl::Status MovedStatus(absl::string_view why) {
  absl::Status s = absl::UnavailableError(why);
  s.SetPayload(kMovedPayload, absl::Cord("1"));
  return s;
}
inline bool IsMoved(const absl::Status& s) { return s.GetPayload(kMovedPayload).has_value(); }

class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // Called once per accepted request, from any thread, never under a communicator's lock.
  virtual void PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) = 0;
};

}  // namespace railyard
