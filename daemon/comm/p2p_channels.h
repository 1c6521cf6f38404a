// The point-to-point channels of one communicator on this daemon: per (src rank, dst rank) the
// FIFO of sends and the FIFO of receives, the n-th send of a channel pairing with its n-th
// receive (MPI's non-overtaking order). Pairs whose ranks both live here are matched here (the
// communicator copies them, one pair per channel at a time); a post to or from a rank on another
// daemon only takes its channel's next number (the tag's sequence field) and is counted while
// in flight. No lock and no timer of its own: the communicator holds its lock around every call
// and keeps each queued request's deadline timer here.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/comm/pending_request.h"
#include "daemon/util/deadline_timer.h"

namespace railyard {

class P2PChannels {
 public:
  using Key = std::pair<int, int>;  // (src rank, dst rank)

  explicit P2PChannels(std::string comm_id) : comm_id_(std::move(comm_id)) {}

  // Queues one side of a same-daemon pair; returns its sequence number on the channel.
  uint64_t Queue(Key key, bool is_send, std::unique_ptr<PendingRequest> request,
                 DeadlineTimer::Id timer);

  struct Match {
    std::unique_ptr<PendingRequest> send;
    std::unique_ptr<PendingRequest> recv;
    uint64_t seq = 0;
    DeadlineTimer::Id send_timer = 0;
    DeadlineTimer::Id recv_timer = 0;
  };
  // The channel's next pair to copy, once both sides are queued and no pair of the channel is
  // being copied (the channel is then busy until Done). nullopt: nothing to do yet.
  // INVALID_ARGUMENT naming both ranks and shapes when the pair disagrees on count or dtype
  // (both stay queued, for the abort to fail).
  absl::StatusOr<std::optional<Match>> Next(Key key);
  // The pair taken by Next finished (or, with no bytes, needs no copy).
  void Done(Key key);
  // The oldest queued request of a side, or null.
  const PendingRequest* Front(Key key, bool send_side) const;
  // True when a request queued now on this side of the channel would find its partner already
  // queued (it waits at most for the channel's copy in progress, not for its peer).
  bool HasPartner(Key key, bool is_send) const;

  // A post to the transport (the other rank is on another daemon): its number on the channel.
  // RESOURCE_EXHAUSTED when the channel already has as many in flight as a tag can number.
  absl::StatusOr<uint64_t> PostRemote(Key key, uint64_t max_in_flight);
  void RemoteDone(Key key);

  // Every queued request with its sequence number, and every timer, for an abort.
  struct Drained {
    std::vector<std::pair<uint64_t, std::unique_ptr<PendingRequest>>> requests;
    std::vector<DeadlineTimer::Id> timers;
  };
  Drained DrainAll();

  // True when a channel with rank on either end has a request queued or a pair being copied, or
  // (with remote) a post to the transport in flight.
  bool Involves(int rank, bool remote) const;
  uint64_t queued() const;  // requests waiting for their other side
  uint64_t busy() const;    // channels copying a pair now

 private:
  struct Channel {
    std::deque<std::unique_ptr<PendingRequest>> sends;
    std::deque<std::unique_ptr<PendingRequest>> recvs;
    std::deque<DeadlineTimer::Id> send_timers;
    std::deque<DeadlineTimer::Id> recv_timers;
    uint64_t matched = 0;  // pairs matched (or remote posts numbered) so far
    bool busy = false;
    uint64_t remote_in_flight = 0;
  };
  const std::string comm_id_;
  std::map<Key, Channel> channels_;
};

}  // namespace railyard
