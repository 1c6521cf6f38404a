// ncclUniqueId as railyard fills it: a magic word, then the railyard comm id
// (ry1-<32 hex>@<coordinator>), NUL-terminated, in the 128 opaque bytes.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace railyard::nccl {

absl::StatusOr<ncclUniqueId> EncodeUniqueId(absl::string_view comm_id);
// INVALID_ARGUMENT for bytes that are not an id this library made (another NCCL's, or garbage).
absl::StatusOr<std::string> DecodeUniqueId(const ncclUniqueId& id);

// The comm id NCCL_COMM_ID=<host:port> stands for in job `job`: coordinated by the railyardd
// whose peer service is at host:port, the same on every rank that sets it.
std::string CommIdAt(absl::string_view coordinator, absl::string_view job);

}  // namespace railyard::nccl
