// The TCP congestion control of the sockets a rail's transport opens (--rail_tcp_congestion).
//
// Why a daemon chooses it. Many hosts default to BBR (net.ipv4.tcp_congestion_control), which
// paces a connection at its estimate of the path's bandwidth: the largest delivery rate of the
// last ten round trips. On a fabric with a round trip of microseconds, ten round trips are a few
// microseconds, and a receiver that reads late (a daemon's progress thread that sleeps when idle
// and is woken by the next message, or is descheduled) makes a delivery-rate sample far below the
// link's; BBR then paces every send at it. Measured on the development VM (docs/data-plane.md,
// "A rail's congestion control"): one end of railyardd's UCX connection on lo was paced at
// 24-74 Gbit/s while OpenMPI's polling ranks' connection was paced at 499, and 2 daemons x 1 rank
// ran 2-32 MiB AllReduces 1.15-1.7x faster once the rail's sockets used cubic, the kernel's own
// default, which does not pace; over a veth pair the connection's retransmissions went from
// 25,000-44,000 per benchmark launch to 0.
//
// UCX opens its sockets inside its own calls (its listener in ucp_worker_create, a connection in
// ucp_ep_create) and offers no hook, and the algorithm must be chosen before a socket connects:
// a connection that BBR started keeps BBR's pacing after a switch (the kernel never clears a
// socket's pacing request), and over a veth pair that pacing reordered packets and made the
// switched connection slower than BBR itself. So this file defines socket() for the process:
// it calls the C library's, and while a TcpCongestionScope is open on the calling thread (the
// rail's owner, around those two calls) a new TCP socket gets the policy before anything else
// happens to it. Connections the listener accepts inherit its choice (Linux keeps a listener's
// TCP_CONGESTION for what it accepts, unless the route names an algorithm). Outside a scope the
// definition only forwards. Executables linking railyard_transport export the symbol
// (-Wl,--export-dynamic-symbol=socket), so that UCX's libraries call it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace railyard::transport {

struct TcpCongestionPolicy {
  enum class Mode {
    kHost,   // leave every socket as the host made it
    kAuto,   // a socket using bbr gets the first of `names` the kernel accepts; others are kept
    kNames,  // every socket gets the first of `names` the kernel accepts
  };
  Mode mode = Mode::kAuto;
  std::vector<std::string> names = {"cubic", "reno"};
};

// "auto" (the default), "host", or a comma-separated list of algorithm names tried in order
// ("cubic", "reno,cubic"). INVALID_ARGUMENT for an empty list, an empty or over-long name
// (the kernel's limit is 15 characters) or a character outside [a-z0-9_-].
absl::StatusOr<TcpCongestionPolicy> ParseTcpCongestionPolicy(absl::string_view flag);
// The flag's text for a policy ("auto", "host", "cubic,reno").
std::string TcpCongestionPolicyText(const TcpCongestionPolicy& policy);

// What applying a policy did.
struct TcpCongestionResult {
  int sockets = 0;    // new TCP sockets found
  int changed = 0;    // of which now use another algorithm
  std::string from;   // the algorithm a changed (or, on failure, the first) socket had
  std::string to;     // the algorithm changed sockets use now
  std::string error;  // why a socket kept its algorithm against the policy (e.g. EPERM)
};

// While one is open, the calling thread's new TCP sockets get `policy`, and what that did is
// added to *result (not null). Scopes nest; the innermost applies.
class TcpCongestionScope {
 public:
  TcpCongestionScope(const TcpCongestionPolicy& policy, TcpCongestionResult* result);
  ~TcpCongestionScope();
  TcpCongestionScope(const TcpCongestionScope&) = delete;
  TcpCongestionScope& operator=(const TcpCongestionScope&) = delete;

 private:
  const TcpCongestionPolicy* previous_policy_;
  TcpCongestionResult* previous_result_;
};

// Whether the process's socket() is this file's (the executable exports it), so that sockets
// libraries open inside a scope get the policy.
bool TcpCongestionHookActive();

// The algorithm a TCP socket uses, or "" when fd is not one.
std::string TcpCongestionOf(int fd);
// Applies policy to one TCP socket; adds what it did to *result.
void ApplyTcpCongestion(int fd, const TcpCongestionPolicy& policy, TcpCongestionResult* result);

}  // namespace railyard::transport
