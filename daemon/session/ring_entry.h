// Decoding one submission-ring entry (proto/railyard/v1/ring.h) into the SubmitRequest a gRPC
// Submit would carry, so that both paths are validated by the same code (DecodeSubmit) after it.
// The bytes are a private copy of what the client wrote: nothing here reads shared memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "railyard/v1/local.pb.h"

namespace railyard {

struct RingSubmission {
  v1::SubmitRequest request;
  // The entry is followed by another of the same group (kFlagGroupNext).
  bool group_next = false;
};

// The request_id of an entry (valid whatever else it holds: error completions name it).
uint64_t RingEntryRequestId(absl::Span<const std::byte> entry);
// How many slots after the entry hold its AllToAllv vectors (as the client says).
uint32_t RingEntryExtSlots(absl::Span<const std::byte> entry);

// entry: kSqEntryBytes; ext: the ext_slots slots after it, concatenated. INVALID_ARGUMENT naming
// the field for an unknown flag, a compression key without the error-feedback flag, an algorithm
// or compression name that is not NUL-terminated printable ASCII, vectors on an operation that
// takes none, or vectors that do not fit (or do not fill) the extension slots. Enum values are
// passed through: DecodeSubmit judges them as it judges a gRPC Submit's.
absl::StatusOr<RingSubmission> DecodeRingEntry(absl::Span<const std::byte> entry,
                                               absl::Span<const std::byte> ext);

}  // namespace railyard
