#include "daemon/comm/op_digest.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/diagnose/verdicts.h"

namespace railyard {

namespace {

constexpr uint32_t kMagic = 0x47445952;  // "RYDG" little-endian
constexpr uint8_t kVersion = 1;
constexpr uint8_t kNoRedOp = 0xff;
constexpr uint8_t kNumOps = static_cast<uint8_t>(scheduler::OpKind::kBarrier) + 1;

// Offsets in the wire form (little-endian).
constexpr size_t kOffMagic = 0, kOffVersion = 4, kOffOp = 5, kOffDtype = 6, kOffRedOp = 7,
                 kOffRoot = 8, kOffCount = 16, kOffSeq = 24, kOffAlgo = 32, kOffCodec = 56,
                 kOffCodecParam = 60;
constexpr uint8_t kNumCodecs = static_cast<uint8_t>(kernels::CodecKind::kTopK) + 1;

template <typename T>
void Put(OpDigest::Wire& w, size_t off, T v) {
  std::memcpy(w.data() + off, &v, sizeof v);
}
template <typename T>
T Get(const OpDigest::Wire& w, size_t off) {
  T v;
  std::memcpy(&v, w.data() + off, sizeof v);
  return v;
}

bool Rooted(scheduler::OpKind op) {
  return op == scheduler::OpKind::kBroadcast || op == scheduler::OpKind::kReduce;
}

}  // namespace

OpDigest OpDigest::Of(const scheduler::RankRequest& r, uint64_t seq, const std::string& algorithm,
                      const kernels::Codec& codec) {
  OpDigest d;
  d.codec = codec;
  // What the wire can say: a topk ratio as the float32 it travels as.
  if (codec.kind == kernels::CodecKind::kTopK) d.codec.topk_ratio = float(codec.topk_ratio);
  d.op = r.op;
  d.dtype = r.dtype;
  d.has_red_op = scheduler::IsReduction(r.op);
  d.red_op = r.red_op;
  d.root = Rooted(r.op) ? r.root : 0;
  d.count = r.op == scheduler::OpKind::kAllToAllv ? 0 : r.count;
  d.seq = seq;
  d.algorithm = algorithm.substr(0, kMaxAlgorithm);
  return d;
}

OpDigest::Wire OpDigest::Encode() const {
  Wire w{};
  Put<uint32_t>(w, kOffMagic, kMagic);
  Put<uint8_t>(w, kOffVersion, kVersion);
  Put<uint8_t>(w, kOffOp, static_cast<uint8_t>(op));
  Put<uint8_t>(w, kOffDtype, static_cast<uint8_t>(dtype));
  Put<uint8_t>(w, kOffRedOp, has_red_op ? static_cast<uint8_t>(red_op) : kNoRedOp);
  Put<int32_t>(w, kOffRoot, root);
  Put<uint64_t>(w, kOffCount, count);
  Put<uint64_t>(w, kOffSeq, seq);
  std::memcpy(w.data() + kOffAlgo, algorithm.data(), std::min(algorithm.size(), kMaxAlgorithm));
  Put<uint8_t>(w, kOffCodec, static_cast<uint8_t>(codec.kind));
  if (codec.kind == kernels::CodecKind::kInt8) Put<uint32_t>(w, kOffCodecParam, codec.block);
  if (codec.kind == kernels::CodecKind::kTopK) {
    Put<float>(w, kOffCodecParam, static_cast<float>(codec.topk_ratio));
  }
  return w;
}

absl::StatusOr<OpDigest> OpDigest::Decode(const Wire& w) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("operation digest from a peer: ", what));
  };
  if (Get<uint32_t>(w, kOffMagic) != kMagic) return bad("bad magic");
  if (Get<uint8_t>(w, kOffVersion) != kVersion) {
    return bad(absl::StrCat("version ", Get<uint8_t>(w, kOffVersion), ", not ", kVersion));
  }
  OpDigest d;
  const uint8_t op = Get<uint8_t>(w, kOffOp);
  if (op >= kNumOps) return bad(absl::StrCat("op ", op, " out of range"));
  d.op = static_cast<scheduler::OpKind>(op);
  const uint8_t dtype = Get<uint8_t>(w, kOffDtype);
  if (dtype >= kernels::kNumDataTypes) return bad(absl::StrCat("dtype ", dtype, " out of range"));
  d.dtype = static_cast<kernels::DataType>(dtype);
  const uint8_t red = Get<uint8_t>(w, kOffRedOp);
  if (red != kNoRedOp) {
    if (red >= kernels::kNumRedOps) return bad(absl::StrCat("red_op ", red, " out of range"));
    d.has_red_op = true;
    d.red_op = static_cast<kernels::RedOp>(red);
  }
  d.root = Get<int32_t>(w, kOffRoot);
  d.count = Get<uint64_t>(w, kOffCount);
  d.seq = Get<uint64_t>(w, kOffSeq);
  for (size_t i = 0; i < kMaxAlgorithm; ++i) {
    const char c = static_cast<char>(w[kOffAlgo + i]);
    if (c == '\0') break;
    if (c < 0x20 || c > 0x7e) return bad("algorithm name is not printable");
    d.algorithm.push_back(c);
  }
  const uint8_t codec = Get<uint8_t>(w, kOffCodec);
  if (codec >= kNumCodecs) return bad(absl::StrCat("codec ", codec, " out of range"));
  d.codec.kind = static_cast<kernels::CodecKind>(codec);
  if (d.codec.kind == kernels::CodecKind::kInt8) {
    d.codec.block = Get<uint32_t>(w, kOffCodecParam);
    if (d.codec.block < 8 || d.codec.block > 65536) {
      return bad(absl::StrCat("int8 block ", d.codec.block, " out of range"));
    }
  }
  if (d.codec.kind == kernels::CodecKind::kTopK) {
    const float ratio = Get<float>(w, kOffCodecParam);
    // Also refuses NaN, which would differ even from itself.
    if (!(ratio > 0.0f && ratio <= 1.0f)) return bad("topk ratio out of (0, 1]");
    d.codec.topk_ratio = ratio;
  }
  return d;
}

std::string OpDigest::Describe(bool with_algorithm) const {
  v1::OpProgress p;
  p.set_op(std::string(scheduler::OpName(op)));
  p.set_dtype(std::string(kernels::Name(dtype)));
  p.set_count(count);
  p.set_bytes(count * kernels::ElementSize(dtype));
  if (has_red_op) p.set_red_op(std::string(kernels::Name(red_op)));
  p.set_root(root);
  std::string out = diagnose::Describe(p);
  if (with_algorithm) absl::StrAppend(&out, " by ", algorithm);
  if (codec.kind != kernels::CodecKind::kNone) {
    absl::StrAppend(&out, " compressed ", kernels::CodecName(codec));
  }
  return out;
}

std::string OpDigest::Differs(const OpDigest& o) const {
  if (op != o.op) return "op";
  if (op == scheduler::OpKind::kBarrier) return seq != o.seq ? "seq" : "";
  if (dtype != o.dtype) return "dtype";
  if (count != o.count) return "count";
  if (has_red_op != o.has_red_op || (has_red_op && red_op != o.red_op)) return "red_op";
  if (root != o.root) return "root";
  if (seq != o.seq) return "seq";
  if (algorithm != o.algorithm) return "algorithm";
  if (codec.kind != o.codec.kind ||
      (codec.kind == kernels::CodecKind::kInt8 && codec.block != o.codec.block) ||
      (codec.kind == kernels::CodecKind::kTopK && codec.topk_ratio != o.codec.topk_ratio)) {
    return "compression";
  }
  return "";
}

absl::Status DisagreementError(uint64_t seq, const std::string& my_node,
                               const std::vector<int>& my_ranks, const OpDigest& mine,
                               const std::string& peer_node, const std::vector<int>& peer_ranks,
                               const OpDigest& theirs) {
  const std::string field = mine.Differs(theirs);
  const bool algo = field == "algorithm";
  return absl::InvalidArgumentError(absl::StrCat(
      "nodes disagree at seq ", seq, " on ", field, ": ", peer_node, " ranks ",
      diagnose::RankRanges(peer_ranks), " submitted ", theirs.Describe(algo), "; ", my_node,
      " ranks ", diagnose::RankRanges(my_ranks), " submitted ", mine.Describe(algo)));
}

}  // namespace railyard
