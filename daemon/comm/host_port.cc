#include "daemon/comm/host_port.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace railyard {
namespace {

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool IsIpv4(absl::string_view host) {
  std::vector<absl::string_view> parts = absl::StrSplit(host, '.');
  if (parts.size() != 4) return false;
  for (absl::string_view p : parts) {
    int v = 0;
    if (!AllDigits(p) || p.size() > 3 || !absl::SimpleAtoi(p, &v) || v > 255) return false;
  }
  return true;
}

// Letters, digits and hyphens in labels of 1..63 bytes, no label starting or ending with a
// hyphen, at most 253 bytes; a trailing dot is not taken (gRPC's resolver does not need it).
bool IsDnsName(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  for (absl::string_view label : absl::StrSplit(host, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
  }
  return true;
}

// Between the brackets: hex digits, colons and (for an embedded IPv4 tail) dots, 2..45 bytes
// with at least two colons. Not a full RFC 4291 parse; the resolver refuses what is still wrong,
// and nothing here can name another scheme or a path.
bool IsIpv6(absl::string_view inner) {
  if (inner.size() < 2 || inner.size() > 45) return false;
  int colons = 0;
  for (char c : inner) {
    if (c == ':') {
      ++colons;
    } else if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != '.') {
      return false;
    }
  }
  return colons >= 2;
}

}  // namespace

std::string HostPortProblem(absl::string_view text) {
  if (text.empty()) return "it is empty";
  if (text.size() > kMaxHostPortBytes) {
    return absl::StrCat("it is ", text.size(), " bytes, more than ", kMaxHostPortBytes);
  }
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) return "it has no :port";
  const absl::string_view host = text.substr(0, colon);
  const absl::string_view port = text.substr(colon + 1);
  int p = 0;
  if (!AllDigits(port) || port.size() > 5 || !absl::SimpleAtoi(port, &p) || p < 1 || p > 65535) {
    return absl::StrCat("port '", port.substr(0, 16), "' is not a number in 1..65535");
  }
  if (!host.empty() && host.front() == '[') {
    if (host.back() != ']' || !IsIpv6(host.substr(1, host.size() - 2))) {
      return "host is not a bracketed IPv6 address";
    }
    return "";
  }
  // A dotted quad is also a DNS name by the letters it uses: check the stricter reading first
  // when the last label is numeric (DNS top-level labels are not all digits).
  const size_t last_dot = host.rfind('.');
  const absl::string_view tld =
      last_dot == absl::string_view::npos ? host : host.substr(last_dot + 1);
  if (AllDigits(tld)) {
    if (!IsIpv4(host)) return "host is neither a DNS name nor an IPv4 dotted quad";
    return "";
  }
  if (!IsDnsName(host)) {
    return "host is not a DNS name, IPv4 address or [IPv6]";
  }
  return "";
}

}  // namespace railyard
