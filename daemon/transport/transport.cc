#include "daemon/transport/transport.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace railyard::transport {

size_t TotalSize(const Segment* segments, int count) {
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += segments[i].size;
  return total;
}

void Endpoint::Send(Tag tag, const void* data, size_t size, CompletionFn done) {
  const Segment segment{const_cast<void*>(data), size};
  SendV(tag, &segment, 1, std::move(done));
}

void Endpoint::Recv(Tag tag, void* data, size_t size, CompletionFn done) {
  const Segment segment{data, size};
  RecvV(tag, &segment, 1, [tag, size, done = std::move(done)](absl::Status s, size_t length) {
    if (s.ok() && length != size) {
      s = absl::InternalError(absl::StrCat("received ", length, " bytes tagged 0x", absl::Hex(tag),
                                           ", expected ", size));
    } else if (absl::IsOutOfRange(s)) {
      s = absl::InternalError(absl::StrCat("message tagged 0x", absl::Hex(tag),
                                           " is longer than the ", size, "-byte receive buffer"));
    }
    done(std::move(s));
  });
}

}  // namespace railyard::transport
