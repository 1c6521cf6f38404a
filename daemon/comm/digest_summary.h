// What a group of nodes knows of its members' operation digests (op_digest.h), as the digest
// exchange gathers it by recursive doubling (digest_exchange.h): either every member submitted
// the same operation (and here is its digest), or two members disagree (both digests), or one
// member sent another something that is not a digest, or one member did not hear from another.
// Two groups' summaries merge into their union's; merged lower group first, the result is the
// same on every node that merges them, so every node of a communicator ends an operation with the
// same verdict. A summary comes from another daemon: untrusted input, decoded with every field
// checked.
//
// Wire form (little-endian): kind (1 byte), 3 zero bytes, node a (uint32), node b (uint32, all
// ones for none), 4 zero bytes, a's digest (64 bytes), then for a disagreement b's digest and for
// an unreadable or missing digest the reason (printable ASCII, NUL-padded): 80 bytes for an
// agreement, 144 for the rest. Whatever follows is the payload the message carries
// (OpDigest::kMaxCarriedBytes).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/comm/op_digest.h"

namespace railyard {

struct DigestSummary {
  enum class Kind : uint8_t {
    kAgree = 1,       // every member submitted da; a is the lowest member heard from
    kDisagree = 2,    // a submitted da, b submitted db, and they differ
    kUnreadable = 3,  // b sent a something that is not a digest summary: reason
    kMissing = 4,     // a did not receive b's summary: reason (a transport error)
  };
  static constexpr size_t kHeaderBytes = 16;
  static constexpr size_t kAgreeBytes = kHeaderBytes + OpDigest::kBytes;
  static constexpr size_t kMaxBytes = kHeaderBytes + 2 * OpDigest::kBytes;
  static constexpr size_t kMaxReason = OpDigest::kBytes;
  using Wire = std::array<std::byte, kMaxBytes>;

  Kind kind = Kind::kAgree;
  int32_t a = 0;
  int32_t b = -1;
  OpDigest da;
  OpDigest db;         // kDisagree
  std::string reason;  // kUnreadable, kMissing: at most kMaxReason printable bytes

  static DigestSummary Of(int node, const OpDigest& digest);
  // `by` received from `of` something unreadable (why), or nothing (why: the transport's
  // status). The reason is cut to kMaxReason bytes and made printable.
  static DigestSummary Unreadable(int by, int of, const std::string& why);
  static DigestSummary Missing(int by, int of, const absl::Status& why);

  // The wire form into *out; returns its length (kAgreeBytes or kMaxBytes).
  size_t Encode(Wire* out) const;
  // The summary at the start of a message of `length` bytes, and how many bytes it took (the
  // rest is carried payload): INVALID_ARGUMENT saying what is wrong, for a message too short,
  // an unknown kind, a node outside [0, nodes), nonzero padding, a digest that does not decode
  // or a reason that is not printable.
  static absl::StatusOr<std::pair<DigestSummary, size_t>> Decode(const std::byte* data,
                                                                 size_t length, int nodes);

  // The summary of two disjoint groups; `lower` is the one whose nodes have the lower numbers.
  // A disagreement or an unreadable digest outranks a missing one, which outranks agreement;
  // between equals the lower group's is kept. Two agreeing groups with different digests
  // disagree: lower's a and da against upper's.
  static DigestSummary Merge(const DigestSummary& lower, const DigestSummary& upper);

  // The operation's outcome on node `me` at `seq` as far as the digests go: OK when all agree;
  // INVALID_ARGUMENT naming both nodes and their ranks for a disagreement (as
  // DisagreementError), or the sender and the reason for an unreadable summary; UNAVAILABLE for
  // a missing one (OK on the node that missed it: its receive's own status says it).
  absl::Status Verdict(uint64_t seq, int me, const std::function<std::string(int)>& node_name,
                       const std::function<std::vector<int>(int)>& ranks_of) const;
  // Whether Verdict is a disagreement (the schedules may wait for messages never sent).
  bool invalid() const { return kind == Kind::kDisagree || kind == Kind::kUnreadable; }
};

}  // namespace railyard
