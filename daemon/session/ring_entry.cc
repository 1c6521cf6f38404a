#include "daemon/session/ring_entry.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "proto/railyard/v1/ring.h"

namespace railyard {

namespace rp = ringproto;

namespace {

template <typename T>
T Load(absl::Span<const std::byte> bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

// A NUL-padded printable-ASCII name of `bytes` bytes at offset (what a client writes is untrusted:
// a name must end within its field and leave nothing after its terminator).
absl::StatusOr<std::string> ReadName(absl::Span<const std::byte> entry, size_t offset, size_t bytes,
                                     const char* field) {
  const char* p = reinterpret_cast<const char*>(entry.data() + offset);
  size_t len = 0;
  while (len < bytes && p[len] != '\0') ++len;
  if (len == bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring entry's ", field, " is not NUL-terminated within ", bytes, " bytes"));
  }
  for (size_t i = 0; i < len; ++i) {
    const auto c = static_cast<unsigned char>(p[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("ring entry's ", field, " has a non-printable byte at ", i));
    }
  }
  for (size_t i = len; i < bytes; ++i) {
    if (p[i] != '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat("ring entry's ", field, " has bytes after its NUL terminator"));
    }
  }
  return std::string(p, len);
}

}  // namespace

uint64_t RingEntryRequestId(absl::Span<const std::byte> entry) {
  if (entry.size() < rp::kSqEntryBytes) return 0;
  return Load<uint64_t>(entry, rp::kSqRequestId);
}

uint32_t RingEntryExtSlots(absl::Span<const std::byte> entry) {
  if (entry.size() < rp::kSqEntryBytes) return 0;
  return Load<uint32_t>(entry, rp::kSqExtSlots);
}

absl::StatusOr<RingSubmission> DecodeRingEntry(absl::Span<const std::byte> entry,
                                               absl::Span<const std::byte> ext) {
  if (entry.size() != rp::kSqEntryBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring entry of ", entry.size(), " bytes, not ", rp::kSqEntryBytes));
  }
  const uint32_t flags = Load<uint32_t>(entry, rp::kSqFlags);
  if ((flags & ~rp::kKnownFlags) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ring entry flags 0x", absl::Hex(flags),
                                                   " has unknown bits 0x",
                                                   absl::Hex(flags & ~rp::kKnownFlags)));
  }
  absl::StatusOr<std::string> algo = ReadName(entry, rp::kSqAlgo, rp::kAlgoBytes, "algo");
  if (!algo.ok()) return algo.status();
  absl::StatusOr<std::string> compression =
      ReadName(entry, rp::kSqCompression, rp::kCompressionBytes, "compression");
  if (!compression.ok()) return compression.status();
  const bool feedback = (flags & rp::kFlagErrorFeedback) != 0;
  const uint64_t key = Load<uint64_t>(entry, rp::kSqCompressionKey);
  if (!feedback && key != 0) {
    return absl::InvalidArgumentError(
        "ring entry has a compression_key (byte 120) but not the error-feedback flag");
  }
  RingSubmission out;
  out.group_next = (flags & rp::kFlagGroupNext) != 0;
  v1::SubmitRequest& r = out.request;
  r.set_group_next(out.group_next);
  r.set_request_id(Load<uint64_t>(entry, rp::kSqRequestId));
  r.set_comm_handle(Load<uint64_t>(entry, rp::kSqCommHandle));
  r.set_count(Load<uint64_t>(entry, rp::kSqCount));
  // Out-of-range enum values stay what they are (proto3 enums are open): DecodeSubmit names them.
  r.set_op(static_cast<v1::CollectiveOp>(Load<int32_t>(entry, rp::kSqOp)));
  r.set_dtype(static_cast<v1::DataType>(Load<int32_t>(entry, rp::kSqDtype)));
  r.set_red_op(static_cast<v1::RedOp>(Load<int32_t>(entry, rp::kSqRedOp)));
  r.set_root(Load<int32_t>(entry, rp::kSqRoot));
  r.set_timeout_ms(Load<uint32_t>(entry, rp::kSqTimeoutMs));
  if (const uint64_t b = Load<uint64_t>(entry, rp::kSqSendBuffer); b != 0) {
    r.mutable_send()->set_buffer_id(b);
    r.mutable_send()->set_offset(Load<uint64_t>(entry, rp::kSqSendOffset));
  } else if (Load<uint64_t>(entry, rp::kSqSendOffset) != 0) {
    return absl::InvalidArgumentError("ring entry has a send offset but no send buffer");
  }
  if (const uint64_t b = Load<uint64_t>(entry, rp::kSqRecvBuffer); b != 0) {
    r.mutable_recv()->set_buffer_id(b);
    r.mutable_recv()->set_offset(Load<uint64_t>(entry, rp::kSqRecvOffset));
  } else if (Load<uint64_t>(entry, rp::kSqRecvOffset) != 0) {
    return absl::InvalidArgumentError("ring entry has a recv offset but no recv buffer");
  }
  r.set_algo(*std::move(algo));
  r.set_compression(*std::move(compression));
  r.set_error_feedback(feedback);
  r.set_compression_key(key);

  uint32_t ext_slots = Load<uint32_t>(entry, rp::kSqExtSlots);
  const uint32_t vec_len = Load<uint32_t>(entry, rp::kSqVecLen);
  if (ext.size() != static_cast<size_t>(ext_slots) * rp::kSqEntryBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ring entry says ", ext_slots,
                                                   " extension slots but ", ext.size(),
                                                   " bytes of them were given"));
  }
  if ((flags & rp::kFlagStreamSync) != 0) {
    if (ext_slots == 0) {
      return absl::InvalidArgumentError(
          "ring entry has the stream-sync flag but no extension slot to hold it");
    }
    // The last slot; what comes before it is the vectors' (if any).
    --ext_slots;
    const absl::Span<const std::byte> slot =
        ext.subspan(static_cast<size_t>(ext_slots) * rp::kSqEntryBytes);
    ext = ext.first(static_cast<size_t>(ext_slots) * rp::kSqEntryBytes);
    v1::StreamSync* sync = r.mutable_stream_sync();
    sync->mutable_words()->set_buffer_id(Load<uint64_t>(slot, rp::kSyncBuffer));
    sync->mutable_words()->set_offset(Load<uint64_t>(slot, rp::kSyncOffset));
    sync->set_value(Load<uint32_t>(slot, rp::kSyncValue));
  }
  if (r.op() != v1::COLLECTIVE_OP_ALL_TO_ALL_V) {
    if (ext_slots != 0 || vec_len != 0) {
      return absl::InvalidArgumentError(absl::StrCat("ring entry carries vectors (ext_slots ",
                                                     ext_slots, ", vec_len ", vec_len,
                                                     ") but only AllToAllv takes them"));
    }
    return out;
  }
  if (ext_slots != rp::ExtSlotsFor(vec_len)) {
    return absl::InvalidArgumentError(absl::StrCat("AllToAllv ring entry: vectors of ", vec_len,
                                                   " entries need ", rp::ExtSlotsFor(vec_len),
                                                   " extension slots, the entry says ", ext_slots));
  }
  google::protobuf::RepeatedField<uint64_t>* vecs[4] = {
      r.mutable_send_counts(), r.mutable_send_displs(), r.mutable_recv_counts(),
      r.mutable_recv_displs()};
  if (vec_len == 0) return out;  // no ranks' worth of vectors (and no bytes to copy)
  for (int v = 0; v < 4; ++v) {
    vecs[v]->Resize(static_cast<int>(vec_len), 0);
    std::memcpy(vecs[v]->mutable_data(), ext.data() + static_cast<size_t>(v) * vec_len * 8,
                static_cast<size_t>(vec_len) * 8);
  }
  return out;
}

}  // namespace railyard
