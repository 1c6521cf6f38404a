// Where the daemon's components read the time from: the real clock in the daemon, a fake one in
// unit tests (tests/unit/fakes.h), so that deadlines can be tested without sleeping.
#pragma once

#include "absl/time/time.h"

namespace railyard {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // absl::Now(); lives for the whole process.
  static const Clock* Real();
};

}  // namespace railyard
