// The end-to-end check of a communicator's inter-node messages (--integrity, InitCommRequest
// .integrity, JoinCommRequest/JoinCommResponse.integrity; daemon/transport/framed_endpoint.h
// applies it). One parser for the daemon flag, the clients' requests, the members' asks and the
// coordinator's answer.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace railyard::transport {

// Ordered by strength.
enum class Integrity { kNone = 0, kCrc32c = 1 };

// "" and "none" -> kNone, "crc32c" -> kCrc32c; anything else INVALID_ARGUMENT.
inline absl::StatusOr<Integrity> ParseIntegrity(absl::string_view name) {
  if (name.empty() || name == "none") return Integrity::kNone;
  if (name == "crc32c") return Integrity::kCrc32c;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown integrity \"", name.substr(0, 32), "\": expected none or crc32c"));
}

// "none" or "crc32c".
inline absl::string_view IntegrityName(Integrity integrity) {
  return integrity == Integrity::kCrc32c ? "crc32c" : "none";
}

inline Integrity Stronger(Integrity a, Integrity b) { return a < b ? b : a; }

}  // namespace railyard::transport
