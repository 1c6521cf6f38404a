// Fuzz target: comm ids as InitComm receives them from clients and JoinComm from peer daemons
// (daemon/comm/comm_id.h). Properties: ParseCommId accepts exactly "ry1-<32 lowercase hex>@
// <coordinator>" with a coordinator of 1..255 bytes, none a space, control character or DEL
// (checked against an independent reading of that grammar); what it accepts formats back to the
// same text and parses again to the same id; what it rejects is INVALID_ARGUMENT with a bounded
// message. CheckRankOf (the first 8 bytes as two int32) accepts exactly 1 <= nranks <= kMaxRanks
// and 0 <= rank < nranks.
#include <cstdint>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/comm/comm_id.h"
#include "daemon/scheduler/tags.h"
#include "tests/fuzz/fuzz_check.h"

namespace railyard {
namespace {

bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

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
  return true;
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
