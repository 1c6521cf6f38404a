#include "daemon/scheduler/rail_stall.h"

namespace railyard::scheduler {

std::optional<RailStall> FindStalledRail(const RunProgress& progress,
                                         std::chrono::steady_clock::time_point now,
                                         std::chrono::steady_clock::duration timeout) {
  if (timeout <= std::chrono::steady_clock::duration::zero()) return std::nullopt;
  std::optional<RailStall> worst;
  for (const RunProgress::Transfer& t : progress.transfers) {
    if (now - t.issued < timeout) continue;
    if (worst && now - t.issued <= worst->waited) continue;
    uint64_t pending = 0;  // on this transfer's (peer, rail)
    for (const RunProgress::Transfer& u : progress.transfers) {
      if (u.peer == t.peer && u.rail == t.rail) pending += u.bytes;
    }
    const auto allowance = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(static_cast<double>(pending) / kRailStallMinBytesPerSecond));
    if (now - t.issued < timeout + allowance) continue;
    bool rail_delivered = false;
    const RunProgress::Received* other = nullptr;
    for (const RunProgress::Received& r : progress.received) {
      if (r.peer != t.peer) continue;
      if (r.rail == t.rail) {
        // Delivered lately: alive (this transfer waits its turn behind others, or is large).
        if (now - r.last < timeout) {
          rail_delivered = true;
          break;
        }
        continue;
      }
      if (r.last <= t.issued) continue;
      if (other == nullptr || r.last > other->last) other = &r;
    }
    if (rail_delivered) continue;
    RailStall s;
    s.peer = t.peer;
    s.rail = t.rail;
    s.step = t.step;
    s.send = t.send;
    s.waited = now - t.issued;
    if (other != nullptr) {
      s.other_rail = other->rail;
      s.other_ago = now - other->last;
    }
    worst = s;
  }
  return worst;
}

}  // namespace railyard::scheduler
