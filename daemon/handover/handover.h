// Both ends of a handover (docs/restarts.md). The old daemon runs a HandoverServer on
// "<socket>.handover"; railyardd --takeover runs a Takeover against it:
//
//   new: Hello ─▶ old: Offer + listening sockets ─▶ new serves on them: Ready ─▶
//   old stops accepting: Released ─▶ old hands its sessions over and exits
//
// Until Ready the old daemon has changed nothing: a new daemon that fails to start, or goes
// away, leaves it serving as before.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/handover/handover_channel.h"
#include "daemon/util/unique_fd.h"

namespace railyard::handover {

// The descriptor names of an Offer.
inline constexpr char kClientSocket[] = "client";
inline constexpr char kSideChannel[] = "side_channel";

class HandoverServer {
 public:
  struct Hooks {
    // The listening sockets to offer, by name (the caller keeps them).
    std::function<std::vector<std::pair<std::string, int>>()> offer;
    // The new daemon serves: stop accepting; returns how many sessions will be handed over.
    std::function<uint32_t()> release;
    // After Released went out: hand the sessions over (this thread; the last hook to run).
    std::function<void()> hand_over;
  };
  // Listens at path (ListenAt); serves one takeover at a time on a thread of its own.
  // ready_timeout: how long an offer waits for Ready.
  static absl::StatusOr<std::unique_ptr<HandoverServer>> Start(std::string path, std::string socket,
                                                               absl::Duration ready_timeout,
                                                               Hooks hooks);
  ~HandoverServer();  // Stop()
  // Stops serving (a takeover in progress before Ready is refused). Idempotent; not from a hook.
  void Stop();
  // True once a takeover reached Released.
  bool handed_over() const { return handed_over_.load(); }

 private:
  HandoverServer() = default;
  void Run();
  // One connection, to its end; true when the node was handed over.
  bool Serve(int fd);

  std::string path_;
  std::string socket_;
  absl::Duration ready_timeout_;
  Hooks hooks_;
  UniqueFd listen_;
  UniqueFd wake_;
  std::atomic<int> conn_{-1};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> handed_over_{false};
  std::thread thread_;
};

// The new daemon's end.
class Takeover {
 public:
  // Connects to the daemon serving `socket` and asks for its listening sockets. UNAVAILABLE
  // when none answers at HandoverPath(socket); FAILED_PRECONDITION when it refuses (versions,
  // a takeover already under way, another --socket).
  static absl::StatusOr<Takeover> Begin(const std::string& socket, absl::Duration timeout);
  Takeover(Takeover&&) = default;
  Takeover& operator=(Takeover&&) = default;

  // The offered descriptor of that name (ownership passes; invalid when not offered).
  UniqueFd Take(const std::string& name);
  // Tells the old daemon this one serves, and waits for it to stop accepting (Released).
  absl::StatusOr<uint32_t> Ready(absl::Duration timeout);
  const std::string& old_version() const { return old_version_; }
  int64_t old_pid() const { return old_pid_; }
  uint32_t old_protocol() const { return old_protocol_; }

 private:
  Takeover() = default;
  UniqueFd conn_;
  std::map<std::string, UniqueFd> fds_;
  std::string old_version_;
  int64_t old_pid_ = 0;
  uint32_t old_protocol_ = 0;
};

}  // namespace railyard::handover
