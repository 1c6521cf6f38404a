// Fuzz target: comm ids as InitComm receives them from clients and JoinComm from peer daemons
// (daemon/comm/comm_id.h). Properties: ParseCommId accepts exactly "ry1-<32 lowercase hex>@
// <coordinator>" with a coordinator of 1..255 bytes, none a space, control character or DEL, that
// is "local:<node>" or host:port (a DNS name, an IPv4 dotted quad or [IPv6], port 1..65535: no
// gRPC target scheme such as unix:, dns:, xds:), checked against an independent reading of that
// grammar; what it accepts formats back to the same text and parses again to the same id; what it
// rejects is INVALID_ARGUMENT with a bounded message. CheckRankOf (the first 8 bytes as two int32)
// accepts exactly 1 <= nranks <= kMaxRanks and 0 <= rank < nranks.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/comm/comm_id.h"
#include "daemon/scheduler/tags.h"
#include "tests/fuzz/fuzz_check.h"

namespace railyard {
namespace {

bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

bool Digit(char c) { return c >= '0' && c <= '9'; }
bool Alnum(char c) { return Digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Decimal 1..65535, at most 5 digits (leading zeros allowed).
bool PortOk(absl::string_view p) {
  if (p.empty() || p.size() > 5) return false;
  uint32_t v = 0;
  for (char c : p) {
    if (!Digit(c)) return false;
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  return v >= 1 && v <= 65535;
}

// host:port read left to right: "[" v6 "]" ":" port, or labels separated by dots then ":" port.
// All-digit last label: the host is a dotted quad, four numbers 0..255 of 1..3 digits.
bool HostPortOk(absl::string_view t) {
  if (t.size() > 259) return false;
  if (!t.empty() && t[0] == '[') {
    const size_t close = t.find(']');
    if (close == absl::string_view::npos || close + 1 >= t.size() || t[close + 1] != ':') {
      return false;
    }
    const absl::string_view inner = t.substr(1, close - 1);
    size_t colons = 0;
    for (char c : inner) {
      const bool hex = Digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
      if (c == ':') ++colons;
      if (!hex && c != ':' && c != '.') return false;
    }
    return inner.size() >= 2 && inner.size() <= 45 && colons >= 2 && PortOk(t.substr(close + 2));
  }
  std::vector<std::string> labels(1);
  size_t i = 0;
  for (; i < t.size() && t[i] != ':'; ++i) {
    if (t[i] == '.') {
      labels.emplace_back();
    } else {
      labels.back().push_back(t[i]);
    }
  }
  if (i == t.size() || i > 253 || !PortOk(t.substr(i + 1))) return false;
  bool numeric_last = !labels.back().empty();
  for (char c : labels.back()) numeric_last = numeric_last && Digit(c);
  if (numeric_last) {
    if (labels.size() != 4) return false;
    for (const std::string& l : labels) {
      if (l.empty() || l.size() > 3) return false;
      int v = 0;
      for (char c : l) {
        if (!Digit(c)) return false;
        v = v * 10 + (c - '0');
      }
      if (v > 255) return false;
    }
    return true;
  }
  for (const std::string& l : labels) {
    if (l.empty() || l.size() > 63 || l.front() == '-' || l.back() == '-') return false;
    for (char c : l) {
      if (!Alnum(c) && c != '-') return false;
    }
  }
  return true;
}

// The grammar of docs/architecture.md's comm ids, read independently of ParseCommId.
bool WellFormed(absl::string_view text) {
  constexpr absl::string_view kPrefix = "ry1-";
  if (text.size() < kPrefix.size() + 32 + 2 || !absl::StartsWith(text, kPrefix)) return false;
  for (size_t i = 0; i < 32; ++i) {
    if (!IsLowerHex(text[kPrefix.size() + i])) return false;
  }
  if (text[kPrefix.size() + 32] != '@') return false;
  const absl::string_view coordinator = text.substr(kPrefix.size() + 33);
  if (coordinator.empty() || coordinator.size() > 255) return false;
  for (char c : coordinator) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) return false;
  }
  if (absl::StartsWith(coordinator, "local:")) return coordinator.size() > 6;
  return HostPortOk(coordinator);
}

void CheckParse(absl::string_view text) {
  absl::StatusOr<CommId> id = ParseCommId(text);
  FUZZ_CHECK(id.ok() == WellFormed(text),
             absl::StrCat("ParseCommId ", id.ok() ? "accepted" : "rejected", " a ",
                          WellFormed(text) ? "well-formed" : "malformed", " id (",
                          id.status().message(), ")"));
  if (!id.ok()) {
    // The message quotes at most 80 bytes of the id.
    FUZZ_CHECK_ERROR(id.status(), absl::StatusCode::kInvalidArgument, 250);
    return;
  }
  FUZZ_CHECK(id->nonce.size() == 32, absl::StrCat("nonce of ", id->nonce.size(), " bytes"));
  const std::string formatted = FormatCommId(*id);
  FUZZ_CHECK(formatted == text, absl::StrCat("formats back as '", formatted.substr(0, 80), "'"));
  absl::StatusOr<CommId> again = ParseCommId(formatted);
  FUZZ_CHECK(again.ok(), std::string(again.status().message()));
  FUZZ_CHECK(again->nonce == id->nonce && again->coordinator == id->coordinator,
             "the formatted id parses to another id");
}

void CheckRanks(int32_t rank, int32_t nranks) {
  const bool expected =
      nranks >= 1 && nranks <= scheduler::tags::kMaxRanks && rank >= 0 && rank < nranks;
  const absl::Status s = CheckRankOf(rank, nranks);
  FUZZ_CHECK(s.ok() == expected,
             absl::StrCat("CheckRankOf(", rank, ", ", nranks, ") = ", s.ToString()));
  if (!s.ok()) FUZZ_CHECK_ERROR(s, absl::StatusCode::kInvalidArgument, 100);
}

}  // namespace
}  // namespace railyard

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  railyard::CheckParse(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (size >= 8) {
    int32_t rank = 0;
    int32_t nranks = 0;
    std::memcpy(&rank, data, 4);
    std::memcpy(&nranks, data + 4, 4);
    railyard::CheckRanks(rank, nranks);
  }
  return 0;
}
