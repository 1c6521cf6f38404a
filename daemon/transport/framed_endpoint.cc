#include "daemon/transport/framed_endpoint.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/transport/crc32c.h"

namespace railyard::transport {
namespace {

void PutLe64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void PutLe32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t GetLe64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}
uint32_t GetLe32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}

// The CRC-32C of the first `bytes` bytes of the segments' concatenation (default: all of it).
uint32_t PayloadCrc(const Segment* segments, int count, size_t bytes = SIZE_MAX) {
  uint32_t crc = 0;
  for (int i = 0; i < count && bytes > 0; ++i) {
    const size_t n = std::min(bytes, segments[i].size);
    crc = Crc32c(segments[i].data, n, crc);
    bytes -= n;
  }
  return crc;
}

// Copies bytes [from, from + size) of the segments' concatenation to out.
void Gather(const Segment* segments, int count, size_t from, size_t size, unsigned char* out) {
  for (int i = 0; i < count && size > 0; ++i) {
    if (from >= segments[i].size) {
      from -= segments[i].size;
      continue;
    }
    const size_t n = std::min(size, segments[i].size - from);
    std::memcpy(out, static_cast<const unsigned char*>(segments[i].data) + from, n);
    out += n;
    size -= n;
    from = 0;
  }
}

}  // namespace

void WriteFrameTrailer(uint64_t secret, Integrity integrity, const Segment* segments, int count,
                       unsigned char out[kFrameTrailerSize], uint32_t extra_flags) {
  const bool crc = integrity == Integrity::kCrc32c;
  PutLe64(out, secret);
  PutLe32(out + 8, crc ? PayloadCrc(segments, count) : 0);
  PutLe32(out + 12, kFrameMagic | (crc ? kFrameFlagCrc32c : 0) | extra_flags);
}

struct FramedEndpoint::Shared {
  Options options;
  std::string link;

  // Bounce buffers of contiguous sends, reused so that large sends do not fault in fresh pages
  // every time. At most kPoolBytes stay cached.
  static constexpr size_t kPoolBytes = size_t{256} << 20;
  struct Buffer {
    std::unique_ptr<unsigned char[]> data;
    size_t capacity = 0;
  };
  absl::Mutex mu;
  std::vector<Buffer> pool ABSL_GUARDED_BY(mu);
  size_t pooled_bytes ABSL_GUARDED_BY(mu) = 0;

  Buffer Take(size_t size) {
    {
      absl::MutexLock lock(&mu);
      for (size_t i = 0; i < pool.size(); ++i) {
        if (pool[i].capacity >= size && pool[i].capacity <= 2 * size) {
          Buffer b = std::move(pool[i]);
          pool[i] = std::move(pool.back());
          pool.pop_back();
          pooled_bytes -= b.capacity;
          return b;
        }
      }
    }
    return Buffer{std::unique_ptr<unsigned char[]>(new unsigned char[size]), size};
  }
  void Give(Buffer b) {
    absl::MutexLock lock(&mu);
    if (pooled_bytes + b.capacity > kPoolBytes) return;  // freed
    pooled_bytes += b.capacity;
    pool.push_back(std::move(b));
  }
};

// One receive, possibly posted several times.
struct FramedEndpoint::Receive {
  std::shared_ptr<Endpoint> inner;
  std::shared_ptr<const Shared> shared;
  Tag tag = 0;
  Segment segments[kMaxSegments];
  int count = 0;  // payload segments; segments[count] is the trailer
  size_t payload = 0;
  unsigned char trailer[kFrameTrailerSize] = {};
  // The payload bytes the accepted message carried: payload, or fewer for a shorter message.
  size_t received = 0;
  int rejections = 0;
  RecvCompletionFn done;
  // Split receives (Options::split_min_bytes): the payload and the trailer arrive as two
  // messages with the tag, received by two receives posted in that order.
  bool split = false;
  absl::Mutex mu;
  bool payload_done ABSL_GUARDED_BY(mu) = false;
  bool trailer_done ABSL_GUARDED_BY(mu) = false;
  bool finished ABSL_GUARDED_BY(mu) = false;  // done has been (or is being) called
  absl::Status payload_status ABSL_GUARDED_BY(mu);
  size_t payload_length ABSL_GUARDED_BY(mu) = 0;
  absl::Status trailer_status ABSL_GUARDED_BY(mu);
  size_t trailer_length ABSL_GUARDED_BY(mu) = 0;
};

FramedEndpoint::FramedEndpoint(std::shared_ptr<Endpoint> inner, Options options)
    : inner_(std::move(inner)), shared_([&] {
        auto shared = std::make_shared<Shared>();
        shared->link = absl::StrCat(options.node, " <- ", options.peer, " rail ", options.rail);
        shared->options = std::move(options);
        return shared;
      }()) {}

std::string FramedEndpoint::LinkName() const { return shared_->link; }

void FramedEndpoint::SendV(Tag tag, const Segment* segments, int count, CompletionFn done) {
  if (count < 1 || count >= kMaxSegments) {
    done(absl::InvalidArgumentError(
        absl::StrCat("a framed send takes 1 to ", kMaxSegments - 1, " segments, not ", count)));
    return;
  }
  const size_t payload = TotalSize(segments, count);
  if (IsSplit(shared_->options, payload)) {
    SendSplit(tag, segments, count, std::move(done));
    return;
  }
  const size_t min_contiguous = shared_->options.contiguous_send_min_bytes;
  if (min_contiguous > 0 && payload >= min_contiguous) {
    // One contiguous buffer: payload, then trailer (see Options::contiguous_send_min_bytes).
    auto buffer = std::make_shared<Shared::Buffer>(shared_->Take(payload + kFrameTrailerSize));
    size_t at = 0;
    for (int i = 0; i < count; ++i) {
      if (segments[i].size > 0)
        std::memcpy(buffer->data.get() + at, segments[i].data, segments[i].size);
      at += segments[i].size;
    }
    WriteFrameTrailer(shared_->options.secret, shared_->options.integrity, segments, count,
                      buffer->data.get() + payload);
    const Segment whole{buffer->data.get(), payload + kFrameTrailerSize};
    inner_->SendV(tag, &whole, 1,
                  [shared = shared_, buffer, done = std::move(done)](absl::Status s) {
                    shared->Give(std::move(*buffer));
                    done(std::move(s));
                  });
    return;
  }
  // The trailer lives until the transport is done with it.
  auto* trailer = new unsigned char[kFrameTrailerSize];
  WriteFrameTrailer(shared_->options.secret, shared_->options.integrity, segments, count, trailer);
  Segment framed[kMaxSegments];
  std::memcpy(framed, segments, sizeof(Segment) * count);
  framed[count] = {trailer, kFrameTrailerSize};
  inner_->SendV(tag, framed, count + 1, [trailer, done = std::move(done)](absl::Status s) {
    delete[] trailer;
    done(std::move(s));
  });
}

bool FramedEndpoint::IsSplit(const Options& options, size_t payload) {
  return options.split_min_bytes > 0 &&
         payload >= std::max(options.split_min_bytes, kFrameTrailerSize + 1);
}

void FramedEndpoint::SendSplit(Tag tag, const Segment* segments, int count, CompletionFn done) {
  // The payload goes out first, as the caller's own buffer (zero-copy for one segment), then the
  // trailer, a second message with the same tag on the same endpoint: tag matching is in order
  // per endpoint, so the receiver's payload receive (posted first) matches the payload. Posting
  // the payload before computing its CRC overlaps the checksum with the transfer: the payload's
  // bytes are stable until done runs (Endpoint::SendV).
  struct Pending {
    absl::Mutex mu;
    int left ABSL_GUARDED_BY(mu) = 2;
    absl::Status status ABSL_GUARDED_BY(mu);
    unsigned char trailer[kFrameTrailerSize] = {};
    CompletionFn done;
  };
  auto pending = std::make_shared<Pending>();
  pending->done = std::move(done);
  auto finish = [pending](absl::Status s) {
    {
      absl::MutexLock lock(&pending->mu);
      if (pending->status.ok()) pending->status = std::move(s);
      if (--pending->left > 0) return;
    }
    CompletionFn d = std::move(pending->done);
    d(pending->status);
  };
  Segment copy[kMaxSegments];
  std::memcpy(copy, segments, sizeof(Segment) * count);
  inner_->SendV(tag, copy, count, finish);
  WriteFrameTrailer(shared_->options.secret, shared_->options.integrity, copy, count,
                    pending->trailer, kFrameFlagSplit);
  const Segment trailer{pending->trailer, kFrameTrailerSize};
  inner_->SendV(tag, &trailer, 1, finish);
}

void FramedEndpoint::RecvV(Tag tag, const Segment* segments, int count, RecvCompletionFn done) {
  if (count < 1 || count >= kMaxSegments) {
    done(absl::InvalidArgumentError(absl::StrCat("a framed receive takes 1 to ", kMaxSegments - 1,
                                                 " segments, not ", count)),
         0);
    return;
  }
  auto r = std::make_shared<Receive>();
  r->inner = inner_;
  r->shared = shared_;
  r->tag = tag;
  std::memcpy(r->segments, segments, sizeof(Segment) * count);
  r->count = count;
  r->payload = TotalSize(segments, count);
  r->received = r->payload;
  r->segments[count] = {r->trailer, kFrameTrailerSize};
  r->done = std::move(done);
  if (IsSplit(shared_->options, r->payload)) {
    r->split = true;
    // In this order (see SendSplit): the first message with the tag fills the payload, the
    // second the trailer.
    inner_->RecvV(tag, r->segments, count, [r](absl::Status s, size_t length) {
      OnSplitPart(r, /*trailer=*/false, std::move(s), length);
    });
    inner_->RecvV(tag, &r->segments[count], 1, [r](absl::Status s, size_t length) {
      OnSplitPart(r, /*trailer=*/true, std::move(s), length);
    });
    return;
  }
  Post(r);
}

void FramedEndpoint::OnSplitPart(const std::shared_ptr<Receive>& r, bool trailer,
                                 absl::Status status, size_t length) {
  absl::Status payload_status, trailer_status;
  size_t payload_length = 0, trailer_length = 0;
  {
    absl::MutexLock lock(&r->mu);
    if (r->finished) return;  // the payload's receive failed before: already reported
    if (trailer) {
      r->trailer_done = true;
      r->trailer_status = std::move(status);
      r->trailer_length = length;
    } else {
      r->payload_done = true;
      r->payload_status = std::move(status);
      r->payload_length = length;
    }
    // The payload's receive writes the destination until it completes, so nothing is reported
    // before it has. Once it has failed, the outcome is known: report at once, whether or not the
    // trailer's receive ever completes (it writes only r->trailer, which r owns; it ends when the
    // next message with the tag arrives, or when the endpoint is aborted or released).
    if (!r->payload_done) return;
    const bool payload_ok = r->payload_status.ok() && r->payload_length == r->payload;
    if (payload_ok && !r->trailer_done) return;
    r->finished = true;
    payload_status = r->payload_status;
    payload_length = r->payload_length;
    trailer_status = r->trailer_status;
    trailer_length = r->trailer_length;
  }
  // Both receives have completed, or the payload's has failed. Each part in turn: a message
  // longer than the part (OUT_OF_RANGE, also what a member's payload looks like in the trailer's
  // receive when a foreign message took its place) or of another length is foreign; any other
  // failure is the transport's and passes through.
  auto part_failed = [&r](absl::string_view part, absl::Status& status, size_t length,
                          size_t expected) {
    if (absl::IsOutOfRange(status)) {
      Fail(r, absl::StrCat("its ", part, "'s receive got a message longer than the ", expected,
                           "-byte ", part));
      return true;
    }
    if (!status.ok()) {
      RecvCompletionFn done = std::move(r->done);
      done(std::move(status), 0);
      return true;
    }
    if (length != expected) {
      Fail(r, absl::StrCat("its ", part, "'s receive got a ", length, "-byte message, the ", part,
                           " has ", expected));
      return true;
    }
    return false;
  };
  if (part_failed("payload", payload_status, payload_length, r->payload) ||
      part_failed("trailer", trailer_status, trailer_length, kFrameTrailerSize)) {
    return;
  }
  if (std::string why = CheckTrailer(r); !why.empty()) {
    Fail(r, why);
    return;
  }
  Accept(r);
}

void FramedEndpoint::Fail(const std::shared_ptr<Receive>& r, const std::string& why) {
  const Options& o = r->shared->options;
  absl::Status status = absl::PermissionDeniedError(absl::StrCat(
      "receive tagged 0x", absl::Hex(r->tag), " on link ", r->shared->link,
      " got a message that is not from a member of the communicator (", why, "); giving up"));
  if (o.on_rejected) o.on_rejected(status);
  RecvCompletionFn done = std::move(r->done);
  done(std::move(status), 0);
}

std::string FramedEndpoint::CheckTrailer(const std::shared_ptr<Receive>& r) {
  const uint32_t magic = GetLe32(r->trailer + 12);
  if ((magic & kFrameMagicMask) != kFrameMagic) {
    return absl::StrCat("no frame trailer (magic 0x", absl::Hex(magic), ")");
  }
  if (GetLe64(r->trailer) != r->shared->options.secret) return "wrong data secret";
  // A trailer sent apart from its payload never ends a one-message frame, nor the reverse, so
  // that neither can stand in for the other.
  if (((magic & kFrameFlagSplit) != 0) != r->split) {
    return r->split ? "a one-message frame's trailer where a separate trailer belongs"
                    : "a separate trailer where a one-message frame belongs";
  }
  return "";
}

void FramedEndpoint::Accept(const std::shared_ptr<Receive>& r) {
  const Options& o = r->shared->options;
  const bool has_crc = (GetLe32(r->trailer + 12) & kFrameFlagCrc32c) != 0;
  if (has_crc && o.offload && r->received >= o.offload_min_bytes) {
    o.offload([r, has_crc] { Verify(r, has_crc); });
    return;
  }
  Verify(r, has_crc);
}

void FramedEndpoint::Post(const std::shared_ptr<Receive>& r) {
  r->inner->RecvV(r->tag, r->segments, r->count + 1,
                  [r](absl::Status s, size_t length) { OnReceived(r, std::move(s), length); });
}

void FramedEndpoint::Reject(const std::shared_ptr<Receive>& r, const std::string& why) {
  const Options& o = r->shared->options;
  ++r->rejections;
  absl::Status status = absl::PermissionDeniedError(
      absl::StrCat("dropped a message tagged 0x", absl::Hex(r->tag), " on link ", r->shared->link,
                   " that is not from a member of the communicator: ", why));
  if (o.on_rejected) o.on_rejected(status);
  if (r->rejections > o.max_rejections) {
    RecvCompletionFn done = std::move(r->done);
    done(absl::PermissionDeniedError(absl::StrCat(
             "receive tagged 0x", absl::Hex(r->tag), " on link ", r->shared->link, " dropped ",
             r->rejections, " messages without the communicator's data secret (last: ", why,
             "); giving up")),
         0);
    return;
  }
  Post(r);
}

void FramedEndpoint::OnReceived(const std::shared_ptr<Receive>& r, absl::Status status,
                                size_t length) {
  const size_t want = r->payload + kFrameTrailerSize;
  if (absl::IsOutOfRange(status)) {
    Reject(r, absl::StrCat("longer than the ", want, "-byte frame"));
    return;
  }
  if (!status.ok()) {
    RecvCompletionFn done = std::move(r->done);
    done(std::move(status), 0);
    return;
  }
  if (length < kFrameTrailerSize) {
    Reject(r, absl::StrCat(length, " bytes, shorter than a frame trailer"));
    return;
  }
  if (length < want) {
    // A shorter frame (RecvV's contract: it fills the first bytes): its trailer is its last 16
    // bytes, wherever in the segments they landed.
    unsigned char trailer[kFrameTrailerSize];
    Gather(r->segments, r->count + 1, length - kFrameTrailerSize, kFrameTrailerSize, trailer);
    std::memcpy(r->trailer, trailer, kFrameTrailerSize);
  }
  r->received = length - kFrameTrailerSize;
  if (std::string why = CheckTrailer(r); !why.empty()) {
    Reject(r, why);
    return;
  }
  Accept(r);
}

void FramedEndpoint::Verify(const std::shared_ptr<Receive>& r, bool has_crc) {
  const Options& o = r->shared->options;
  if (has_crc || o.integrity == Integrity::kCrc32c) {
    std::string error;
    if (!has_crc) {
      error = absl::StrCat("the ", r->received, "-byte message tagged 0x", absl::Hex(r->tag),
                           " carries no CRC-32C but the communicator runs with integrity crc32c");
    } else {
      const uint32_t sent = GetLe32(r->trailer + 8);
      const uint32_t got = PayloadCrc(r->segments, r->count, r->received);
      if (sent != got) {
        error = absl::StrCat("CRC-32C 0x", absl::Hex(got, absl::kZeroPad8), " of the ", r->received,
                             "-byte message tagged 0x", absl::Hex(r->tag), " does not match the ",
                             "sender's 0x", absl::Hex(sent, absl::kZeroPad8));
      }
    }
    if (!error.empty()) {
      if (o.on_integrity_error) o.on_integrity_error();
      RecvCompletionFn done = std::move(r->done);
      done(absl::DataLossError(
               absl::StrCat("integrity check failed on link ", r->shared->link, ": ", error)),
           0);
      return;
    }
  }
  RecvCompletionFn done = std::move(r->done);
  done(absl::OkStatus(), r->received);
}

}  // namespace railyard::transport
