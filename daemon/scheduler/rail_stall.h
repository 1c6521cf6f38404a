// Suspecting a stopped rail from what one run has seen (RunProgress): a transfer on (peer, rail)
// has waited past a deadline and nothing arrived from that peer on that rail for as long (what
// arrived earlier in the operation does not count: a link can go down half-way through). That
// alone does not tell a rail down (a link down, a cable pulled, a switch port dead:
// TCP keeps such connections open and silent) from a peer that is late (its ranks have not
// submitted yet, it waits for a third node): the peer's own view decides
// (daemon/diagnose/rail_check.h), which the daemon asks for before it blames the rail.
#pragma once

#include <chrono>
#include <optional>

#include "daemon/scheduler/node_executor.h"

namespace railyard::scheduler {

struct RailStall {
  int peer = 0;  // node index
  int rail = 0;
  uint32_t step = 0;  // the oldest stalled transfer
  bool send = false;
  std::chrono::steady_clock::duration waited{};  // since that transfer was issued
  // A rail that delivered from peer since that transfer was issued, and how long ago it last
  // did (-1: none did).
  int other_rail = -1;
  std::chrono::steady_clock::duration other_ago{};
};

// The slowest rate a working rail is assumed to move a run's pending bytes at. UCX reports a
// message only once it has all arrived, so a large one in flight looks silent: a rail is given
// its pending bytes' time at this rate on top of the timeout (1 s per MiB; chunked schedules
// keep a few chunks of 64 KiB to 4 MiB in flight, an unchunked 256 MiB message gets 256 s).
inline constexpr double kRailStallMinBytesPerSecond = 1 << 20;

// The suspect whose transfer waited longest, if any transfer has waited at least `timeout` plus
// its (peer, rail)'s pending bytes at kRailStallMinBytesPerSecond while nothing arrived from
// its peer on its rail for the last `timeout`. timeout <= 0: never.
std::optional<RailStall> FindStalledRail(const RunProgress& progress,
                                         std::chrono::steady_clock::time_point now,
                                         std::chrono::steady_clock::duration timeout);

}  // namespace railyard::scheduler
