#include "daemon/transport/ucx/ucx_address.h"

#include <cstdint>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace railyard::transport {
namespace {

constexpr absl::string_view kScheme = "ucx";

uint32_t Fnv1a32(absl::string_view a, absl::string_view b) {
  uint32_t h = 2166136261u;
  for (absl::string_view part : {a, b}) {
    for (char c : part) {
      h ^= static_cast<uint8_t>(c);
      h *= 16777619u;
    }
  }
  return h;
}

bool IsHex(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

std::string SanitizeUcxLabel(absl::string_view label) {
  std::string out(label);
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (!(absl::ascii_isalnum(u) || c == '.' || c == '_' || c == '-' || c == '/' || c == '@')) {
      c = '_';
    }
  }
  return out;
}

std::string EncodeUcxAddress(const UcxWorkerAddress& address) {
  return absl::StrCat(kScheme, ":", address.label, ":", absl::BytesToHexString(address.bytes), ":",
                      absl::Hex(Fnv1a32(address.label, address.bytes), absl::kZeroPad8));
}

absl::StatusOr<UcxWorkerAddress> DecodeUcxAddress(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  if (parts.size() != 4 || parts[0] != kScheme) {
    return absl::InvalidArgumentError(absl::StrCat("malformed UCX peer address \"",
                                                   absl::CHexEscape(text.substr(0, 64)),
                                                   "\": expected ucx:<label>:<hex>:<checksum>"));
  }
  const absl::string_view hex = parts[2];
  if (hex.empty() || hex.size() % 2 != 0 || !IsHex(hex)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed UCX peer address for \"", absl::CHexEscape(parts[1]),
                     "\": the worker address is not a non-empty even-length hex string"));
  }
  if (parts[3].size() != 8 || !IsHex(parts[3])) {
    return absl::InvalidArgumentError(absl::StrCat("malformed UCX peer address for \"",
                                                   absl::CHexEscape(parts[1]),
                                                   "\": the checksum is not 8 hex digits"));
  }
  UcxWorkerAddress address{std::string(parts[1]), absl::HexStringToBytes(hex)};
  const std::string expected =
      absl::StrCat(absl::Hex(Fnv1a32(address.label, address.bytes), absl::kZeroPad8));
  if (absl::AsciiStrToLower(parts[3]) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("corrupt UCX peer address for \"", absl::CHexEscape(parts[1]),
                     "\": checksum mismatch (truncated or edited in transit?)"));
  }
  return address;
}

}  // namespace railyard::transport
