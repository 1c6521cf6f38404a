// Fuzz target: Local.Submit as the daemon decodes it (daemon/submit/request_decode.h), the one
// request of the Local API whose every field a client controls and the daemon turns into
// addresses it then reads and writes. Input: 3 header bytes, then a serialized
// railyard.v1.SubmitRequest. Byte 0 picks the communicator size (1..16, or one of a few large
// sizes up to the tag layout's kMaxRanks), bytes 1-2 the caller's rank in it. The session holds
// four mapped buffers: ids 1 and 2 (4096 bytes), 3 (100 bytes: not a page multiple) and 4 (1 MiB).
// Properties of an accepted request: the op, dtype, red_op, algo, root and count are the
// request's; every region the op touches (its extents, recomputed) lies inside the buffer the
// request named, at an offset that is a multiple of the element size, and is readable and
// writable; regions that overlap are the op's in-place layout. A rejected one is
// INVALID_ARGUMENT or NOT_FOUND with a bounded message (no echo of unbounded input).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/scheduler/algorithms/algorithms.h"
#include "daemon/scheduler/op.h"
#include "daemon/scheduler/tags.h"
#include "daemon/session/session.h"
#include "daemon/session/shm_segment.h"
#include "daemon/submit/request_decode.h"
#include "railyard/v1/local.pb.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/quiet_protobuf.h"

namespace railyard {
namespace {

constexpr uint64_t kBufferSizes[] = {4096, 4096, 100, 1 << 20};

// A sealed memfd mapped the way RegisterBuffer maps a client's (the mapping stays until the
// process exits).
std::shared_ptr<MappedSegment> MapBuffer(int index, uint64_t size) {
  const std::string name = absl::StrCat("railyard.fuzz-", index);
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid() || ::fallocate(fd.get(), 0, 0, static_cast<off_t>(size)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, MappedSegment::kRequiredSeals) != 0) {
    std::perror("request_decode_fuzz: memfd_create/fallocate/F_ADD_SEALS");
    std::abort();
  }
  absl::StatusOr<std::shared_ptr<MappedSegment>> seg = MappedSegment::MapMemfd(std::move(fd), size);
  if (!seg.ok()) {
    std::fprintf(stderr, "request_decode_fuzz: %s\n", seg.status().ToString().c_str());
    std::abort();
  }
  return *std::move(seg);
}

const Session& TheSession() {
  static Session* const session = [] {
    auto* s = new Session("fuzz-session", "fuzz-job", ::getpid(), "fuzz");
    for (int i = 0; i < 4; ++i) {
      const absl::Status added = s->AddBuffer(i + 1, MapBuffer(i, kBufferSizes[i]));
      if (!added.ok()) std::abort();
    }
    return s;
  }();
  return *session;
}

int CommSize(uint8_t b) {
  constexpr int kLarge[] = {
      17, 255, 1000, 4096, scheduler::tags::kMaxRanks - 1, scheduler::tags::kMaxRanks};
  if (b < 240) return 1 + b % 16;
  return kLarge[(b - 240) % (sizeof(kLarge) / sizeof(kLarge[0]))];
}

// The region [p, p + bytes) must lie inside `segment` at an element-aligned offset; touches its
// first and last byte (a region past the mapping faults even where ASan cannot see).
void CheckRegion(const char* which, const std::byte* p, uint64_t bytes, size_t esize,
                 const std::shared_ptr<MappedSegment>& segment, uint64_t buffer_id,
                 const Session& session) {
  if (bytes == 0) return;
  FUZZ_CHECK(p != nullptr && segment != nullptr,
             absl::StrCat(which, ": ", bytes, " bytes to touch but no buffer"));
  FUZZ_CHECK(segment == session.FindBuffer(buffer_id),
             absl::StrCat(which, ": not the buffer the request named (", buffer_id, ")"));
  const std::byte* begin = segment->data();
  FUZZ_CHECK(p >= begin && p <= begin + segment->size(), absl::StrCat(which, ": outside buffer"));
  const uint64_t offset = static_cast<uint64_t>(p - begin);
  FUZZ_CHECK(offset % esize == 0,
             absl::StrCat(which, ": offset ", offset, " not aligned to ", esize));
  FUZZ_CHECK(bytes <= segment->size() - offset,
             absl::StrCat(which, ": [", offset, ", +", bytes, ") runs past the ", segment->size(),
                          "-byte buffer"));
  auto* first = const_cast<volatile std::byte*>(p);
  auto* last = const_cast<volatile std::byte*>(p + bytes - 1);
  *first = *first;
  *last = *last;
}

void CheckAccepted(const v1::SubmitRequest& in, const PendingRequest& out, int rank, int nranks,
                   const Session& session) {
  const scheduler::RankRequest& r = out.req;
  FUZZ_CHECK(out.request_id == in.request_id() && out.rank == rank, "request id or rank changed");
  scheduler::OpKind op;
  FUZZ_CHECK(FromProto(in.op(), &op) && op == r.op, "op changed");
  FUZZ_CHECK(r.algo == in.algo() && ValidAlgo(r.algo), "algo changed or invalid");
  FUZZ_CHECK(r.count == in.count() && r.root == in.root(), "count or root changed");
  if (r.op != scheduler::OpKind::kBarrier) {
    kernels::DataType dtype;
    FUZZ_CHECK(FromProto(in.dtype(), &dtype) && dtype == r.dtype, "dtype changed");
  }
  if (scheduler::IsReduction(r.op)) {
    kernels::RedOp red;
    FUZZ_CHECK(FromProto(in.red_op(), &red) && red == r.red_op, "red_op changed");
  }
  if (scheduler::HasRoot(r.op)) {
    FUZZ_CHECK(r.root >= 0 && r.root < nranks, absl::StrCat("root ", r.root, " of ", nranks));
  }
  if (r.op == scheduler::OpKind::kAllToAllv) {
    const size_t n = static_cast<size_t>(nranks);
    FUZZ_CHECK(r.send_counts.size() == n && r.send_displs.size() == n &&
                   r.recv_counts.size() == n && r.recv_displs.size() == n,
               "alltoallv vectors are not one entry per rank");
  }
  absl::StatusOr<scheduler::Extents> e = scheduler::ComputeExtents(r, rank, nranks);
  FUZZ_CHECK(e.ok(), absl::StrCat("accepted, but its extents fail: ", e.status().message()));
  const size_t esize = kernels::ElementSize(r.dtype);
  if (e->needs_send) {
    CheckRegion("send", r.send, e->send_bytes, esize, out.send_segment, in.send().buffer_id(),
                session);
  }
  if (e->needs_recv) {
    CheckRegion("recv", r.recv, e->recv_bytes, esize, out.recv_segment, in.recv().buffer_id(),
                session);
  }
  FUZZ_CHECK(in.has_stream_sync() == out.sync.has_value(), "stream sync lost or made up");
  if (out.sync.has_value()) {
    const StreamSync& s = *out.sync;
    FUZZ_CHECK(s.words != nullptr &&
                   s.words == session.FindBuffer(in.stream_sync().words().buffer_id()) &&
                   !s.words->on_device() && s.offset % 4 == 0 && s.offset <= s.words->size() &&
                   s.words->size() - s.offset >= 8 && s.value == in.stream_sync().value(),
               "stream sync words outside their host buffer");
  }
  if (e->needs_send && e->needs_recv && e->send_bytes > 0 && e->recv_bytes > 0 &&
      r.send != nullptr && r.recv != nullptr) {
    const bool overlap = r.send < r.recv + e->recv_bytes && r.recv < r.send + e->send_bytes;
    FUZZ_CHECK(!overlap || scheduler::IsInPlace(r, rank),
               "send and recv overlap but are not the in-place layout");
  }
}

}  // namespace
}  // namespace railyard

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace railyard;
  if (size < 3) return 0;
  const int nranks = CommSize(data[0]);
  const int rank = static_cast<int>((data[1] | (data[2] << 8)) % nranks);
  v1::SubmitRequest req;
  if (!req.ParseFromArray(data + 3, static_cast<int>(size - 3))) return 0;
  const Session& session = TheSession();
  absl::StatusOr<std::unique_ptr<PendingRequest>> out = DecodeSubmit(req, session, rank, nranks);
  if (out.ok()) {
    CheckAccepted(req, **out, rank, nranks, session);
  } else if (out.status().code() != absl::StatusCode::kNotFound) {
    // The longest: "unknown algo '<32 bytes>' (expected <every algorithm name>)".
    FUZZ_CHECK_ERROR(out.status(), absl::StatusCode::kInvalidArgument, 400);
  } else {
    FUZZ_CHECK_ERROR(out.status(), absl::StatusCode::kNotFound, 200);
  }
  return 0;
}
