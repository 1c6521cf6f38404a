// What every daemon of a multi-node communicator must agree on before its run of one collective
// means anything: op, dtype, count, root, reduction and the algorithm. The daemons gather their
// 64-byte digests by recursive doubling as they start the run (digest_exchange.h: ceil(log2 N)
// small messages per daemon, beside the schedule's own, on rail 0 with the reserved step tag
// tags::kDigestStep; one that leaves as the run starts carries the schedule's first message to
// that peer when that one is small: kMaxCarriedBytes): a disagreement fails the operation on every
// node with INVALID_ARGUMENT naming both sides, instead of leaving the schedules waiting for
// messages the other side never sends until the deadline. A digest comes from another daemon:
// untrusted input, decoded with every field checked.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/kernels/types.h"
#include "daemon/scheduler/op.h"

namespace railyard {

struct OpDigest {
  static constexpr size_t kBytes = 64;
  using Wire = std::array<std::byte, kBytes>;
  // The digest message to a peer may carry, after its kBytes, the payload of the schedule's
  // first message to that peer when it is at most this long, leaves on rail 0 and depends on
  // nothing (Communicator::StartDigestExchange): a small operation then sends one message per
  // peer, not two. The receiver tells from the length.
  static constexpr size_t kMaxCarriedBytes = 1024;

  scheduler::OpKind op = scheduler::OpKind::kBarrier;
  kernels::DataType dtype = kernels::DataType::kFloat32;
  bool has_red_op = false;
  kernels::RedOp red_op = kernels::RedOp::kSum;
  int32_t root = 0;
  uint64_t count = 0;  // 0 for AllToAllv (its counts differ per rank by design)
  uint64_t seq = 0;
  std::string algorithm;  // at most kMaxAlgorithm bytes, printable
  // The codec its inter-node steps run with (none: exact); topk's ratio travels as a float32.
  kernels::Codec codec;

  static constexpr size_t kMaxAlgorithm = 24;

  // The digest of a merged request (every local rank's agrees) run with `algorithm` and `codec`.
  static OpDigest Of(const scheduler::RankRequest& r, uint64_t seq, const std::string& algorithm,
                     const kernels::Codec& codec = {});
  Wire Encode() const;
  // INVALID_ARGUMENT saying which field is not one this daemon could have sent.
  static absl::StatusOr<OpDigest> Decode(const Wire& wire);

  // "allreduce float count=1024 (4 KiB) sum", with " by ALGO" when with_algorithm and
  // " compressed CODEC" when it is.
  std::string Describe(bool with_algorithm = false) const;
  // The first field where other differs ("op", "dtype", "count", "red_op", "root", "seq",
  // "algorithm", "compression"), or empty when they agree.
  std::string Differs(const OpDigest& other) const;
};

// The INVALID_ARGUMENT of a disagreement at seq between this node's ranks and a peer node's.
absl::Status DisagreementError(uint64_t seq, const std::string& my_node,
                               const std::vector<int>& my_ranks, const OpDigest& mine,
                               const std::string& peer_node, const std::vector<int>& peer_ranks,
                               const OpDigest& theirs);

}  // namespace railyard
