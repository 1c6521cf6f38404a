// Fuzz target: one submission-ring entry as the daemon decodes it (daemon/session/ring_entry.h),
// bytes a client writes into shared memory and the daemon turns into a SubmitRequest. Input: the
// 128-byte entry, then any number of bytes as its extension slots (cut to whole slots). Properties
// of an accepted entry: its request_id, comm_handle, count and root are the entry's bytes; vectors
// only on AllToAllv, each vec_len long and equal to the bytes of the slots; a stream sync only
// with its flag, equal to the last slot's bytes; the algorithm is printable ASCII. A rejected one
// is INVALID_ARGUMENT with a bounded message.
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/session/ring_entry.h"
#include "proto/railyard/v1/ring.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/quiet_protobuf.h"

namespace rp = railyard::ringproto;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < rp::kSqEntryBytes) return 0;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  const size_t ext_bytes = (size - rp::kSqEntryBytes) / rp::kSqEntryBytes * rp::kSqEntryBytes;
  absl::Span<const std::byte> entry(bytes, rp::kSqEntryBytes);
  absl::Span<const std::byte> ext(bytes + rp::kSqEntryBytes, ext_bytes);
  absl::StatusOr<railyard::RingSubmission> got = railyard::DecodeRingEntry(entry, ext);
  if (!got.ok()) {
    FUZZ_CHECK_ERROR(got.status(), absl::StatusCode::kInvalidArgument, 300);
    return 0;
  }
  auto u64 = [&](size_t off) {
    uint64_t v;
    std::memcpy(&v, data + off, 8);
    return v;
  };
  const railyard::v1::SubmitRequest& r = got->request;
  FUZZ_CHECK(r.request_id() == u64(rp::kSqRequestId), "request_id");
  FUZZ_CHECK(r.comm_handle() == u64(rp::kSqCommHandle), "comm_handle");
  FUZZ_CHECK(r.count() == u64(rp::kSqCount), "count");
  FUZZ_CHECK(r.send().buffer_id() == u64(rp::kSqSendBuffer), "send buffer");
  FUZZ_CHECK(r.recv().buffer_id() == u64(rp::kSqRecvBuffer), "recv buffer");
  for (char c : r.algo()) FUZZ_CHECK(c > 0x20 && c < 0x7f, "algo byte");
  FUZZ_CHECK(r.algo().size() < rp::kAlgoBytes, "algo length");
  uint32_t flags;
  std::memcpy(&flags, data + rp::kSqFlags, 4);
  const bool sync = (flags & rp::kFlagStreamSync) != 0;
  FUZZ_CHECK(sync == r.has_stream_sync(), "stream_sync without its flag, or the flag without it");
  const size_t sync_bytes = sync ? rp::kSqEntryBytes : 0;
  if (sync) {
    // The last slot holds it.
    FUZZ_CHECK(ext_bytes >= rp::kSqEntryBytes, "stream sync without a slot");
    const size_t at = rp::kSqEntryBytes + ext_bytes - rp::kSqEntryBytes;
    uint32_t value;
    std::memcpy(&value, data + at + rp::kSyncValue, 4);
    FUZZ_CHECK(r.stream_sync().words().buffer_id() == u64(at + rp::kSyncBuffer) &&
                   r.stream_sync().words().offset() == u64(at + rp::kSyncOffset) &&
                   r.stream_sync().value() == value,
               "stream sync is not the last slot's bytes");
  }
  const bool vectors = r.op() == railyard::v1::COLLECTIVE_OP_ALL_TO_ALL_V;
  if (!vectors) {
    FUZZ_CHECK(r.send_counts_size() == 0 && r.recv_displs_size() == 0, "vectors on a non-v op");
    FUZZ_CHECK(ext_bytes == sync_bytes, "extension slots accepted on a non-v op");
    return 0;
  }
  uint32_t vec_len;
  std::memcpy(&vec_len, data + rp::kSqVecLen, 4);
  FUZZ_CHECK(ext_bytes == rp::ExtSlotsFor(vec_len) * rp::kSqEntryBytes + sync_bytes,
             "extension size");
  const google::protobuf::RepeatedField<uint64_t>* vecs[4] = {&r.send_counts(), &r.send_displs(),
                                                              &r.recv_counts(), &r.recv_displs()};
  for (int v = 0; v < 4; ++v) {
    FUZZ_CHECK(vecs[v]->size() == static_cast<int>(vec_len), absl::StrCat("vector ", v));
    if (vec_len > 0) {
      FUZZ_CHECK(std::memcmp(vecs[v]->data(), data + rp::kSqEntryBytes + v * vec_len * 8,
                             vec_len * 8) == 0,
                 absl::StrCat("vector ", v, " bytes"));
    }
  }
  return 0;
}
