#include "daemon/util/clock.h"

#include "absl/time/clock.h"

namespace railyard {
namespace {
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};
}  // namespace

const Clock* Clock::Real() {
  static const RealClock* clock = new RealClock;
  return clock;
}

}  // namespace railyard
