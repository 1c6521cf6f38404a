#include "daemon/transport/tcp_congestion.h"

#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace railyard::transport {
namespace {

// TCP_CA_NAME_MAX is 16 with the terminating NUL.
constexpr size_t kMaxNameLength = 15;

thread_local const TcpCongestionPolicy* t_policy = nullptr;
thread_local TcpCongestionResult* t_result = nullptr;

}  // namespace

absl::StatusOr<TcpCongestionPolicy> ParseTcpCongestionPolicy(absl::string_view flag) {
  TcpCongestionPolicy policy;
  if (flag == "auto") return policy;
  if (flag == "host") {
    policy.mode = TcpCongestionPolicy::Mode::kHost;
    policy.names.clear();
    return policy;
  }
  policy.mode = TcpCongestionPolicy::Mode::kNames;
  policy.names.clear();
  for (absl::string_view name : absl::StrSplit(flag, ',')) {
    if (name.empty() || name.size() > kMaxNameLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rail_tcp_congestion '", flag, "': want auto, host or a comma-separated list of TCP ",
          "congestion control names of 1-", kMaxNameLength, " characters (e.g. cubic,reno)"));
    }
    for (char c : name) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) {
        return absl::InvalidArgumentError(
            absl::StrCat("--rail_tcp_congestion '", flag, "': '", name,
                         "' is not a TCP congestion control name (a-z, 0-9, _ and - only)"));
      }
    }
    if (name == "auto" || name == "host") {
      return absl::InvalidArgumentError(absl::StrCat("--rail_tcp_congestion '", flag, "': ", name,
                                                     " stands alone, not in a list of names"));
    }
    policy.names.emplace_back(name);
  }
  return policy;
}

std::string TcpCongestionPolicyText(const TcpCongestionPolicy& policy) {
  switch (policy.mode) {
    case TcpCongestionPolicy::Mode::kHost:
      return "host";
    case TcpCongestionPolicy::Mode::kAuto:
      return "auto";
    case TcpCongestionPolicy::Mode::kNames:
      break;
  }
  return absl::StrJoin(policy.names, ",");
}

std::string TcpCongestionOf(int fd) {
  // Fails (ENOTSOCK, ENOPROTOOPT, EOPNOTSUPP) for anything but a TCP socket.
  char name[kMaxNameLength + 1] = {};
  socklen_t len = sizeof(name) - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, strnlen(name, len));
}

void ApplyTcpCongestion(int fd, const TcpCongestionPolicy& policy, TcpCongestionResult* result) {
  const std::string current = TcpCongestionOf(fd);
  if (current.empty()) return;
  ++result->sockets;
  if (policy.mode == TcpCongestionPolicy::Mode::kHost) return;
  if (policy.mode == TcpCongestionPolicy::Mode::kAuto && current != "bbr") return;
  std::string why;
  for (const std::string& name : policy.names) {
    if (name == current) return;  // already on the first of the names the kernel accepts
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                   static_cast<socklen_t>(name.size())) == 0) {
      ++result->changed;
      if (result->from.empty()) result->from = current;
      result->to = name;
      return;
    }
    absl::StrAppend(&why, why.empty() ? "" : "; ", name, ": ", std::strerror(errno));
  }
  if (result->from.empty()) result->from = current;
  if (result->error.empty()) result->error = why;
}

TcpCongestionScope::TcpCongestionScope(const TcpCongestionPolicy& policy,
                                       TcpCongestionResult* result)
    : previous_policy_(t_policy), previous_result_(t_result) {
  t_policy = &policy;
  t_result = result;
}

TcpCongestionScope::~TcpCongestionScope() {
  t_policy = previous_policy_;
  t_result = previous_result_;
}

bool TcpCongestionHookActive() {
  return dlsym(RTLD_DEFAULT, "socket") == reinterpret_cast<void*>(&::socket);
}

}  // namespace railyard::transport

// The process's socket() (see tcp_congestion.h): the next definition (the C library's, or a
// sanitizer's in front of it), then the policy of the thread's open scope, if any.
extern "C" int socket(int domain, int type, int protocol) {
  using SocketFn = int (*)(int, int, int);
  static const SocketFn next = reinterpret_cast<SocketFn>(dlsym(RTLD_NEXT, "socket"));
  const int fd = next != nullptr ? next(domain, type, protocol)
                                 : static_cast<int>(syscall(SYS_socket, domain, type, protocol));
  using railyard::transport::t_policy;
  if (fd >= 0 && t_policy != nullptr && (domain == AF_INET || domain == AF_INET6) &&
      (type & 0xf) == SOCK_STREAM) {
    railyard::transport::ApplyTcpCongestion(fd, *t_policy, railyard::transport::t_result);
  }
  return fd;
}
