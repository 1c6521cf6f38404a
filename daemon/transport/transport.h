// The data plane between daemons, as the scheduler's executor sees it: move bytes to and from a
// peer daemon over one rail, asynchronously. A transport never knows what a collective is.
//
// Two implementations: UCX (daemon/transport/ucx), one worker per rail, which the daemon uses
// between nodes; and the in-process fabric (daemon/transport/inproc, test-only), which unit tests
// of the executor and the communicator use. Memory-only work on one node never goes through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace railyard::transport {

// Called exactly once per Send/Recv, from a transport thread: OK once the bytes have left the
// source buffer (Send) or arrived in full (Recv), else why not (UNAVAILABLE for a dead peer).
using CompletionFn = std::function<void(absl::Status)>;

// Matches a send with its receive. The scheduler packs (the receiver's slot for the communicator,
// sender, sequence number, step) into it (daemon/scheduler/tags.h) so that a tag is unique among
// everything in flight to one rail's worker; transports match tags exactly (full 64-bit mask),
// in posting order per endpoint, and need not look inside.
using Tag = uint64_t;

// A part of a message. A vectored Send/Recv moves one message whose bytes are its segments'
// concatenation, without copying them together: UCX sends and receives an iov datatype, so a
// payload and the small trailer that FramedEndpoint appends go out as one message. A send never
// writes through data.
struct Segment {
  void* data = nullptr;
  size_t size = 0;
};
// The most segments one vectored operation takes.
inline constexpr int kMaxSegments = 4;

// Called exactly once per RecvV, from a transport thread: OK and the message's length (at most
// the segments' total; a shorter message fills the first `length` bytes), OUT_OF_RANGE when the
// message was longer than the segments (it is consumed: the receive is over, the bytes in the
// segments are unspecified), else why not as for CompletionFn.
using RecvCompletionFn = std::function<void(absl::Status, size_t length)>;

// A connection to one peer daemon over one rail. Thread-safe.
class Endpoint {
 public:
  virtual ~Endpoint() = default;
  // Sends the concatenation of segments[0, count) as one message tagged tag. The array is copied
  // before SendV returns; the bytes it points to stay valid until done runs. 1 <= count <=
  // kMaxSegments (else INVALID_ARGUMENT through done).
  virtual void SendV(Tag tag, const Segment* segments, int count, CompletionFn done) = 0;
  // Receives one message tagged tag into segments[0, count), in order; see RecvCompletionFn.
  virtual void RecvV(Tag tag, const Segment* segments, int count, RecvCompletionFn done) = 0;
  // Fails every pending and later operation on this endpoint with status.
  virtual void Abort(const absl::Status& status) = 0;

  // Sends bytes [data, data + size) tagged tag. data stays valid until done runs.
  void Send(Tag tag, const void* data, size_t size, CompletionFn done);
  // Receives exactly size bytes tagged tag into data: a message of another length fails the
  // receive (INTERNAL).
  void Recv(Tag tag, void* data, size_t size, CompletionFn done);
};

// The segments' total size.
size_t TotalSize(const Segment* segments, int count);

class Transport {
 public:
  virtual ~Transport() = default;
  // Rails (NICs) this daemon has; rail indices are [0, num_rails()).
  virtual int num_rails() const = 0;
  // Opaque address of this daemon's worker on rail, exchanged during communicator bootstrap.
  virtual absl::StatusOr<std::string> LocalAddress(int rail) = 0;
  // Connects to a peer's worker on rail, given the address its LocalAddress returned.
  virtual absl::StatusOr<std::shared_ptr<Endpoint>> Connect(const std::string& peer_address,
                                                            int rail) = 0;
  // Stops progress; pending operations fail with CANCELLED.
  virtual void Shutdown() = 0;

  // Polling by a caller's thread. A transport with progress threads hands every message to one
  // and wakes it; on a small host each wake-up costs tens of microseconds, more than a small
  // message's whole trip. A thread that spins anyway (a session's ring thread while its
  // operations are in flight) registers with BeginPolling; while any thread is registered the
  // transport lets its progress threads sleep on a short timeout instead of waking them for new
  // work, and Poll() runs it: Poll starts what was posted and progresses the wire on the calling
  // thread, running completion callbacks there, and says whether anything happened. Poll never
  // blocks (it returns at once when another thread is progressing); EndPolling hands progress
  // back. A registered thread that does not poll delays other threads' work by at most that
  // timeout (UcxTransport: 1 ms). A transport without progress threads keeps these no-ops.
  virtual void BeginPolling() {}
  virtual bool Poll() { return false; }
  virtual void EndPolling() {}
};

}  // namespace railyard::transport
