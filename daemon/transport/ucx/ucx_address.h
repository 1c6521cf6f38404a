// The printable form of a UCX worker address, as LocalAddress() returns it and Connect() takes it:
//   ucx:<label>:<worker address in hex>:<FNV-1a 32 of label and address, 8 hex digits>
// The label (node name and rail) lets errors name the peer; the checksum turns a truncated or
// mistyped address into INVALID_ARGUMENT here instead of undefined behaviour inside
// ucp_ep_create, which trusts the address bytes it is given.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace railyard::transport {

struct UcxWorkerAddress {
  std::string label;  // e.g. "node-a/rail0"
  std::string bytes;  // what ucp_worker_get_address returned
};

// Replaces characters that the printable form reserves (':') or that would make it unprintable.
std::string SanitizeUcxLabel(absl::string_view label);

std::string EncodeUcxAddress(const UcxWorkerAddress& address);

// INVALID_ARGUMENT naming what is wrong when text is not something EncodeUcxAddress produced.
absl::StatusOr<UcxWorkerAddress> DecodeUcxAddress(absl::string_view text);

}  // namespace railyard::transport
