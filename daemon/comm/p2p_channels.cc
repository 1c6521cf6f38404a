#include "daemon/comm/p2p_channels.h"

#include "absl/strings/str_cat.h"

namespace railyard {

uint64_t P2PChannels::Queue(Key key, bool is_send, std::unique_ptr<PendingRequest> request,
                            DeadlineTimer::Id timer) {
  Channel& ch = channels_[key];
  auto& queue = is_send ? ch.sends : ch.recvs;
  const uint64_t seq = ch.matched + queue.size();
  queue.push_back(std::move(request));
  (is_send ? ch.send_timers : ch.recv_timers).push_back(timer);
  return seq;
}

absl::StatusOr<std::optional<P2PChannels::Match>> P2PChannels::Next(Key key) {
  Channel& ch = channels_[key];
  if (ch.busy || ch.sends.empty() || ch.recvs.empty()) return std::nullopt;
  const PendingRequest& send = *ch.sends.front();
  const PendingRequest& recv = *ch.recvs.front();
  if (send.req.dtype != recv.req.dtype || send.req.count != recv.req.count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "send/recv mismatch on communicator ", comm_id_, " (pair seq ", ch.matched, "): rank ",
        key.first, " sends ", send.req.count, " x ", std::string(kernels::Name(send.req.dtype)),
        " to rank ", key.second, ", which receives ", recv.req.count, " x ",
        std::string(kernels::Name(recv.req.dtype))));
  }
  Match m;
  m.send = std::move(ch.sends.front());
  m.recv = std::move(ch.recvs.front());
  m.send_timer = ch.send_timers.front();
  m.recv_timer = ch.recv_timers.front();
  ch.sends.pop_front();
  ch.recvs.pop_front();
  ch.send_timers.pop_front();
  ch.recv_timers.pop_front();
  m.seq = ch.matched++;
  ch.busy = true;
  return std::optional<Match>(std::move(m));
}

void P2PChannels::Done(Key key) { channels_[key].busy = false; }

const PendingRequest* P2PChannels::Front(Key key, bool send_side) const {
  auto it = channels_.find(key);
  if (it == channels_.end()) return nullptr;
  const auto& queue = send_side ? it->second.sends : it->second.recvs;
  return queue.empty() ? nullptr : queue.front().get();
}

bool P2PChannels::HasPartner(Key key, bool is_send) const {
  auto it = channels_.find(key);
  if (it == channels_.end()) return false;
  const Channel& ch = it->second;
  return (is_send ? ch.recvs.size() : ch.sends.size()) >
         (is_send ? ch.sends.size() : ch.recvs.size());
}

absl::StatusOr<uint64_t> P2PChannels::PostRemote(Key key, uint64_t max_in_flight) {
  Channel& ch = channels_[key];
  if (ch.remote_in_flight >= max_in_flight) {
    return absl::ResourceExhaustedError(absl::StrCat(
        ch.remote_in_flight, " sends/receives between rank ", key.first, " and rank ", key.second,
        " of communicator ", comm_id_, " are already in flight, the most their tags can number"));
  }
  ++ch.remote_in_flight;
  return ch.matched++;  // each side numbers its own posts on the channel in FIFO order
}

void P2PChannels::RemoteDone(Key key) { --channels_[key].remote_in_flight; }

P2PChannels::Drained P2PChannels::DrainAll() {
  Drained out;
  for (auto& [key, ch] : channels_) {
    out.timers.insert(out.timers.end(), ch.send_timers.begin(), ch.send_timers.end());
    out.timers.insert(out.timers.end(), ch.recv_timers.begin(), ch.recv_timers.end());
    ch.send_timers.clear();
    ch.recv_timers.clear();
    uint64_t seq = ch.matched;
    for (auto& r : ch.sends) out.requests.emplace_back(seq++, std::move(r));
    seq = ch.matched;
    for (auto& r : ch.recvs) out.requests.emplace_back(seq++, std::move(r));
    ch.sends.clear();
    ch.recvs.clear();
  }
  return out;
}

bool P2PChannels::Involves(int rank, bool remote) const {
  for (const auto& [key, ch] : channels_) {
    if (key.first != rank && key.second != rank) continue;
    if (!ch.sends.empty() || !ch.recvs.empty() || ch.busy) return true;
    if (remote && ch.remote_in_flight > 0) return true;
  }
  return false;
}

uint64_t P2PChannels::queued() const {
  uint64_t n = 0;
  for (const auto& [key, ch] : channels_) n += ch.sends.size() + ch.recvs.size();
  return n;
}

uint64_t P2PChannels::busy() const {
  uint64_t n = 0;
  for (const auto& [key, ch] : channels_) n += ch.busy ? 1 : 0;
  return n;
}

}  // namespace railyard
