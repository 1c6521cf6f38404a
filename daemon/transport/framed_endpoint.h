// The frame of every inter-node message of a communicator: the payload, then a 16-byte trailer
//
//   offset 0   u64  data secret   the communicator's (JoinCommResponse.data_secret)
//   offset 8   u32  crc           CRC-32C of the payload (daemon/transport/crc32c.h), 0 without
//   offset 12  u32  magic | flags kFrameMagic (0x5259_01_00: "RY", version 1) | kFrameFlagCrc32c
//                                 | kFrameFlagSplit
//
// all little-endian. Below Options::split_min_bytes (512 KiB) payload and trailer are one
// transport message, sent as an iov of the payload's segments and the trailer (on a tcp rail
// zero-copy from 64 KiB: ucx/ucx_transport.h) and received as one, payload straight into the
// destination. From there they are two messages with the same tag on
// the same endpoint, the payload (sent and received contiguous, straight from and into the
// caller's buffer, as UCX 1.13's rendezvous zero-copies only contiguous sends) and then the
// trailer (flag split), received by two receives posted in that order; UCX matches one
// endpoint's messages with a tag in the order they were sent. docs/data-plane.md says what the
// frame defends against, what it does not, and what it costs.
//
// Receiving a one-message frame, FramedEndpoint accepts a message only when it is at most
// payload + 16 bytes long (a shorter one, at least 16, fills the first bytes of the segments
// and its last 16 are its trailer: RecvV reports its payload's length, which Endpoint::Recv
// refuses unless exact), has the magic, carries the secret and has no split flag. Anything
// else was not sent by a member of this communicator (UCX matches tags worker-wide, so whoever
// reaches the worker can aim at a posted receive): it is counted (on_rejected) and the receive is
// posted again with the same tag, so the member's message still lands; the destination is
// written only by the receive and read only after its completion, so a dropped message's bytes
// never reach anyone. After max_rejections such messages for one receive, it fails with
// PERMISSION_DENIED naming the link.
//
// Receiving a split frame, it accepts only when the first message with the tag is exactly the
// payload's length and the second exactly 16 bytes with the magic, the secret and the split flag.
// The member sends its payload (longer than 16 bytes) before its trailer, so a foreign message
// matched by either receive pushes the member's payload into the trailer's receive or leaves its
// payload's receive with a wrong length or its trailer's with a wrong trailer: the receive fails
// with PERMISSION_DENIED naming the link (counted by on_rejected), without re-posting (the
// member's payload may have been consumed by the trailer's receive). A foreign message after
// the trailer stays unmatched. Failure is reported as soon as the payload's receive has failed,
// else once both have completed, never while the destination may still be written.
//
// Either way, a message that has the secret but whose CRC does not match (or that lacks a CRC
// where the communicator requires one) fails the receive with DATA_LOSS "integrity check failed on
// link <node> <- <peer> rail <rail>: ..." (on_integrity_error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/transport/integrity.h"
#include "daemon/transport/transport.h"

namespace railyard::transport {

inline constexpr size_t kFrameTrailerSize = 16;
// Options::split_min_bytes by default: UCX's rendezvous threshold on the tcp transport with the
// 512 KiB segments railyardd sets (transport::SetUcxTcpDefaults; `ucx_info -u twe -e`:
// tag_send 0..<egr/short>..524281..<egr/zcopy>..524288..<rndv>). Below it a contiguous message
// goes eagerly, straight from the caller's buffer, and is copied out of UCX's receive buffer on
// arrival (from it too, over tcp under peer error handling); a payload of its own saves only the
// sender's copy next to the trailer, and the trailer's message of its own measured dearer than
// that copy (docs/data-plane.md, "Frames below the rendezvous size").
inline constexpr size_t kDefaultSplitMinBytes = 512 * 1024;
inline constexpr uint32_t kFrameMagic = 0x52590100;  // low byte: flags
inline constexpr uint32_t kFrameMagicMask = 0xFFFFFF00;
inline constexpr uint32_t kFrameFlagCrc32c = 0x01;
// The trailer was sent as a message of its own after its payload (Options::split_min_bytes).
inline constexpr uint32_t kFrameFlagSplit = 0x02;

class FramedEndpoint : public Endpoint {
 public:
  struct Options {
    uint64_t secret = 0;
    // kCrc32c: every message sent carries the payload's CRC-32C and every message received must
    // carry one that matches. kNone: none is computed; a received one is still checked.
    Integrity integrity = Integrity::kNone;
    // The link, for messages: this node, the peer node, the rail name.
    std::string node;
    std::string peer;
    std::string rail;
    // Foreign messages one receive drops before it fails (PERMISSION_DENIED).
    int max_rejections = 16;
    // Each dropped message, with why (PERMISSION_DENIED status). On a transport thread: cheap.
    std::function<void(const absl::Status&)> on_rejected;
    // Each message whose checksum failed. Cheap: on a transport or offload thread.
    std::function<void()> on_integrity_error;
    // Where a received message's CRC is verified when its payload has at least
    // offload_min_bytes: offload(task) runs task on another thread (the daemon's executor).
    // Unset: on the transport thread that completed the receive (the rail's progress thread for
    // UCX), which then cannot progress the rail meanwhile.
    std::function<void(std::function<void()>)> offload;
    size_t offload_min_bytes = 64 * 1024;
    // Payloads of at least this many bytes are sent as one contiguous buffer (payload copied next
    // to the trailer in a pooled bounce buffer) instead of an iov. 0 (the default): always an
    // iov. The copy was the default from 64 KiB while UCX packed every eager iov on tcp anyway
    // (and its rendezvous packs an iov in small fragments, 2x slower at 1 MiB than a memcpy plus
    // a contiguous send; split payloads, split_min_bytes, never come here). Since tcp rails
    // send eager messages zero-copy from 64 KiB (kUcxTcpZcopyThresh in ucx/ucx_transport.h) the iov
    // is what goes out, and the copy only cost CPU (docs/data-plane.md, "Frames as an iov, sent
    // zero-copy"). Receives are always an iov (measured as fast as contiguous).
    size_t contiguous_send_min_bytes = 0;
    // Payloads of at least this many bytes (and more than kFrameTrailerSize) travel as two
    // messages with the tag, in order on this endpoint: the payload, straight from and into the
    // caller's buffer (zero-copy), then the trailer (flag kFrameFlagSplit). Part of the wire
    // format: both ends of a link must use the same value. 0: never.
    size_t split_min_bytes = kDefaultSplitMinBytes;
  };

  FramedEndpoint(std::shared_ptr<Endpoint> inner, Options options);

  // At most kMaxSegments - 1 segments: the trailer takes one.
  void SendV(Tag tag, const Segment* segments, int count, CompletionFn done) override;
  // Completes OK only with a member's message of at most the segments' total, and of exactly
  // that for a split frame (the reported length is the message's payload); see the header
  // comment for everything else.
  void RecvV(Tag tag, const Segment* segments, int count, RecvCompletionFn done) override;
  void Abort(const absl::Status& status) override { inner_->Abort(status); }

  // "<node> <- <peer> rail <rail>".
  std::string LinkName() const;

 private:
  struct Shared;
  struct Receive;
  static void Post(const std::shared_ptr<Receive>& r);
  static void OnReceived(const std::shared_ptr<Receive>& r, absl::Status status, size_t length);
  static void Reject(const std::shared_ptr<Receive>& r, const std::string& why);
  static void Verify(const std::shared_ptr<Receive>& r, bool has_crc);
  static bool IsSplit(const Options& options, size_t payload);
  void SendSplit(Tag tag, const Segment* segments, int count, CompletionFn done);
  static void OnSplitPart(const std::shared_ptr<Receive>& r, bool trailer, absl::Status status,
                          size_t length);
  // A split receive's failure on a foreign message: PERMISSION_DENIED, no re-posting.
  static void Fail(const std::shared_ptr<Receive>& r, const std::string& why);
  // Why the trailer is not a member's for r, or "".
  static std::string CheckTrailer(const std::shared_ptr<Receive>& r);
  // The trailer is a member's: checks the CRC (offloaded if so configured) and completes.
  static void Accept(const std::shared_ptr<Receive>& r);

  const std::shared_ptr<Endpoint> inner_;
  const std::shared_ptr<Shared> shared_;
};

// Writes the trailer of a message whose payload is segments[0, count) (tests, and the sender).
// extra_flags: kFrameFlagSplit for a trailer sent apart from its payload.
void WriteFrameTrailer(uint64_t secret, Integrity integrity, const Segment* segments, int count,
                       unsigned char out[kFrameTrailerSize], uint32_t extra_flags = 0);

}  // namespace railyard::transport
