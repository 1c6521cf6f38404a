#include "daemon/submit/request_decode.h"

#include "absl/strings/str_cat.h"
#include "daemon/scheduler/algorithms/algorithms.h"

namespace railyard {

using kernels::DataType;
using kernels::RedOp;
using scheduler::OpKind;

bool FromProto(v1::DataType in, DataType* out) {
  switch (in) {
    case v1::DATA_TYPE_FLOAT32:
      *out = DataType::kFloat32;
      return true;
    case v1::DATA_TYPE_FLOAT64:
      *out = DataType::kFloat64;
      return true;
    case v1::DATA_TYPE_FLOAT16:
      *out = DataType::kFloat16;
      return true;
    case v1::DATA_TYPE_BFLOAT16:
      *out = DataType::kBFloat16;
      return true;
    case v1::DATA_TYPE_INT8:
      *out = DataType::kInt8;
      return true;
    case v1::DATA_TYPE_UINT8:
      *out = DataType::kUint8;
      return true;
    case v1::DATA_TYPE_INT32:
      *out = DataType::kInt32;
      return true;
    case v1::DATA_TYPE_UINT32:
      *out = DataType::kUint32;
      return true;
    case v1::DATA_TYPE_INT64:
      *out = DataType::kInt64;
      return true;
    case v1::DATA_TYPE_UINT64:
      *out = DataType::kUint64;
      return true;
    default:
      return false;
  }
}

bool FromProto(v1::RedOp in, RedOp* out) {
  switch (in) {
    case v1::RED_OP_SUM:
      *out = RedOp::kSum;
      return true;
    case v1::RED_OP_PROD:
      *out = RedOp::kProd;
      return true;
    case v1::RED_OP_MIN:
      *out = RedOp::kMin;
      return true;
    case v1::RED_OP_MAX:
      *out = RedOp::kMax;
      return true;
    case v1::RED_OP_AVG:
      *out = RedOp::kAvg;
      return true;
    default:
      return false;
  }
}

// The op list is common.proto's; OpKind follows it one for one (proto number - 1), so that a
// collective added to one and not the other stops the build here.
constexpr bool SameOp(OpKind kind, v1::CollectiveOp wire) {
  return static_cast<int>(kind) + 1 == static_cast<int>(wire);
}
static_assert(SameOp(OpKind::kAllReduce, v1::COLLECTIVE_OP_ALL_REDUCE));
static_assert(SameOp(OpKind::kReduceScatter, v1::COLLECTIVE_OP_REDUCE_SCATTER));
static_assert(SameOp(OpKind::kAllGather, v1::COLLECTIVE_OP_ALL_GATHER));
static_assert(SameOp(OpKind::kBroadcast, v1::COLLECTIVE_OP_BROADCAST));
static_assert(SameOp(OpKind::kReduce, v1::COLLECTIVE_OP_REDUCE));
static_assert(SameOp(OpKind::kAllToAll, v1::COLLECTIVE_OP_ALL_TO_ALL));
static_assert(SameOp(OpKind::kAllToAllv, v1::COLLECTIVE_OP_ALL_TO_ALL_V));
static_assert(SameOp(OpKind::kSend, v1::COLLECTIVE_OP_SEND));
static_assert(SameOp(OpKind::kRecv, v1::COLLECTIVE_OP_RECV));
static_assert(SameOp(OpKind::kBarrier, v1::COLLECTIVE_OP_BARRIER));
static_assert(v1::CollectiveOp_MAX == v1::COLLECTIVE_OP_BARRIER,
              "common.proto has a collective OpKind lacks");

bool FromProto(v1::CollectiveOp in, OpKind* out) {
  switch (in) {
    case v1::COLLECTIVE_OP_ALL_REDUCE:
      *out = OpKind::kAllReduce;
      return true;
    case v1::COLLECTIVE_OP_REDUCE_SCATTER:
      *out = OpKind::kReduceScatter;
      return true;
    case v1::COLLECTIVE_OP_ALL_GATHER:
      *out = OpKind::kAllGather;
      return true;
    case v1::COLLECTIVE_OP_BROADCAST:
      *out = OpKind::kBroadcast;
      return true;
    case v1::COLLECTIVE_OP_REDUCE:
      *out = OpKind::kReduce;
      return true;
    case v1::COLLECTIVE_OP_ALL_TO_ALL:
      *out = OpKind::kAllToAll;
      return true;
    case v1::COLLECTIVE_OP_ALL_TO_ALL_V:
      *out = OpKind::kAllToAllv;
      return true;
    case v1::COLLECTIVE_OP_SEND:
      *out = OpKind::kSend;
      return true;
    case v1::COLLECTIVE_OP_RECV:
      *out = OpKind::kRecv;
      return true;
    case v1::COLLECTIVE_OP_BARRIER:
      *out = OpKind::kBarrier;
      return true;
    default:
      return false;
  }
}

bool ValidAlgo(absl::string_view algo) {
  return algo.empty() || scheduler::algorithms::IsAlgorithmName(algo);
}

namespace {

// Resolves one buffer reference of `bytes` bytes. Returns null for "not given" (buffer_id 0)
// only when that is allowed: the region is empty.
// Regions of at least this many bytes are checked for pages the client released
// (MappedSegment::CheckResident) before the operation. The check is a mincore call, 0.7 us for a
// page and 1.1 us for 1 MiB here: on every region it made 8-byte AllReduces of 2 ranks 1.7x
// slower (8.8 vs 5.2 us, medians of 3). Below this size an operation takes longer than the
// check only by a few times, and what it can make the daemon fault is bounded as everything a
// client registered is, by the byte quotas (README, "Denial of service").
constexpr uint64_t kResidentCheckMinBytes = uint64_t{1} << 20;

// check_resident: also check that its pages are there (MappedSegment::CheckResident) when it is
// large enough; false when the same region was just checked (an in-place operation's receive).
absl::Status Resolve(const v1::BufferRef& ref, const char* which, uint64_t bytes, size_t esize,
                     const Session& session, std::shared_ptr<MappedSegment>* segment,
                     std::byte** ptr, bool check_resident = true) {
  if (ref.buffer_id() == 0) {
    if (bytes == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(which, " buffer is required (", bytes, " bytes) but buffer_id is 0"));
  }
  *segment = session.FindBuffer(ref.buffer_id());
  if (*segment == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(which, " buffer ", ref.buffer_id(), " is not registered in this session"));
  }
  // Offsets come from the client as any 64-bit value: say what is wrong before any sum of them.
  const uint64_t offset = ref.offset();
  const uint64_t size = (*segment)->size();
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, bytes, &end)) {
    return absl::InvalidArgumentError(
        absl::StrCat(which, " buffer ", ref.buffer_id(), ": offset ", offset, " + ", bytes,
                     " bytes overflows 64 bits (the buffer has ", size, " bytes)"));
  }
  if (offset > size) {
    return absl::InvalidArgumentError(absl::StrCat(which, " buffer ", ref.buffer_id(), ": offset ",
                                                   offset, " is past the end of the ", size,
                                                   "-byte buffer by ", offset - size, " bytes"));
  }
  if (absl::Status s = (*segment)->CheckRange(offset, bytes, esize); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(which, " buffer ", ref.buffer_id(), ": ", s.message()));
  }
  if (absl::Status s = check_resident && bytes >= kResidentCheckMinBytes
                           ? (*segment)->CheckResident(offset, bytes)
                           : absl::OkStatus();
      !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(which, " buffer ", ref.buffer_id(), ": ", s.message()));
  }
  *ptr = (*segment)->data() + offset;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StreamSync> ResolveStreamSync(const v1::StreamSync& in, const Session& session) {
  const uint64_t id = in.words().buffer_id();
  if (id == 0) {
    return absl::InvalidArgumentError(
        "stream_sync.words: buffer_id is 0 (the ready and done words need a host buffer)");
  }
  StreamSync out;
  out.words = session.FindBuffer(id);
  if (out.words == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("stream_sync.words: buffer ", id, " is not registered in this session"));
  }
  if (out.words->on_device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stream_sync.words: buffer ", id, " is ", scheduler::MemoryName(out.words->device()),
        "; the ready and done words must be host memory the daemon can read and write"));
  }
  out.buffer_id = id;
  out.offset = in.words().offset();
  if (out.offset % 4 != 0 || out.offset > out.words->size() || out.words->size() - out.offset < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stream_sync.words: offset ", out.offset, " in the ", out.words->size(), "-byte buffer ",
        id, " does not hold two 4-byte-aligned u32 words (ready, done)"));
  }
  out.value = in.value();
  return out;
}

absl::StatusOr<std::unique_ptr<PendingRequest>> DecodeSubmit(const v1::SubmitRequest& in,
                                                             const Session& session, int rank,
                                                             int nranks) {
  auto out = std::make_unique<PendingRequest>();
  out->request_id = in.request_id();
  out->rank = rank;
  scheduler::RankRequest& r = out->req;
  if (!FromProto(in.op(), &r.op)) {
    return absl::InvalidArgumentError(
        absl::StrCat("op ", static_cast<int>(in.op()), " is not a collective operation"));
  }
  if (r.op != OpKind::kBarrier && !FromProto(in.dtype(), &r.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", static_cast<int>(in.dtype()), " is not a supported data type"));
  }
  if (scheduler::IsReduction(r.op) && !FromProto(in.red_op(), &r.red_op)) {
    return absl::InvalidArgumentError(absl::StrCat("red_op ", static_cast<int>(in.red_op()),
                                                   " is not a reduction (sum|prod|min|max|avg)"));
  }
  if (!ValidAlgo(in.algo())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown algo '", in.algo().substr(0, 32),
                                                   "' (expected ",
                                                   scheduler::algorithms::AlgorithmNames(), ")"));
  }
  r.algo = in.algo();
  if (in.compression() == "auto") {
    r.codec_auto = true;
  } else if (!in.compression().empty()) {
    absl::StatusOr<kernels::Codec> codec = kernels::ParseCodec(in.compression());
    if (!codec.ok()) return codec.status();
    r.codec = *codec;
  }
  if (in.compression_key() != 0 && !in.error_feedback()) {
    return absl::InvalidArgumentError(
        "compression_key is set but error_feedback is not (the key names a residual)");
  }
  r.error_feedback = in.error_feedback();
  r.feedback_key = in.compression_key();
  r.count = in.count();
  r.root = in.root();
  r.send_counts.assign(in.send_counts().begin(), in.send_counts().end());
  r.send_displs.assign(in.send_displs().begin(), in.send_displs().end());
  r.recv_counts.assign(in.recv_counts().begin(), in.recv_counts().end());
  r.recv_displs.assign(in.recv_displs().begin(), in.recv_displs().end());
  absl::StatusOr<scheduler::Extents> extents = scheduler::ComputeExtents(r, rank, nranks);
  if (!extents.ok()) return extents.status();
  const size_t esize = kernels::ElementSize(r.dtype);
  if (extents->needs_send) {
    if (auto s = Resolve(in.send(), "send", extents->send_bytes, esize, session, &out->send_segment,
                         &r.send);
        !s.ok()) {
      return s;
    }
  }
  if (extents->needs_recv) {
    // In place (the receive is the send's region or a prefix of it): its pages were just checked.
    const bool in_place = extents->needs_send && in.recv().buffer_id() == in.send().buffer_id() &&
                          in.recv().offset() == in.send().offset() &&
                          extents->recv_bytes <= extents->send_bytes;
    if (auto s = Resolve(in.recv(), "recv", extents->recv_bytes, esize, session, &out->recv_segment,
                         &r.recv, /*check_resident=*/!in_place);
        !s.ok()) {
      return s;
    }
  }
  // Where the memory is: all of one operation's buffers on the host, or all on one device.
  const MappedSegment* send_seg = out->send_segment.get();
  const MappedSegment* recv_seg = out->recv_segment.get();
  if (send_seg != nullptr && recv_seg != nullptr && send_seg->device() != recv_seg->device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("send buffer ", in.send().buffer_id(), " is ",
                     scheduler::MemoryName(send_seg->device()), " and recv buffer ",
                     in.recv().buffer_id(), " is ", scheduler::MemoryName(recv_seg->device()),
                     ": an operation's buffers must all be host memory or all on one device"));
  }
  r.device = send_seg != nullptr   ? send_seg->device()
             : recv_seg != nullptr ? recv_seg->device()
                                   : -1;
  if (auto s = scheduler::CheckInPlaceLayout(r, rank, *extents); !s.ok()) return s;
  if (in.has_stream_sync()) {
    absl::StatusOr<StreamSync> sync = ResolveStreamSync(in.stream_sync(), session);
    if (!sync.ok()) return sync.status();
    out->sync = *std::move(sync);
  }
  out->timeout = absl::Milliseconds(in.timeout_ms());
  out->group_next = in.group_next();
  return out;
}

}  // namespace railyard
