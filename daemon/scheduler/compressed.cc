#include "daemon/scheduler/compressed.h"

#include <algorithm>
#include <initializer_list>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/kernels/reduce.h"
#include "daemon/scheduler/tags.h"

namespace railyard::scheduler {

bool CompressionApplies(OpKind op, kernels::DataType dtype, kernels::RedOp red_op, int nnodes) {
  const bool floating = dtype == kernels::DataType::kFloat32 ||
                        dtype == kernels::DataType::kFloat16 ||
                        dtype == kernels::DataType::kBFloat16;
  return (op == OpKind::kAllReduce || op == OpKind::kReduceScatter) && floating &&
         (red_op == kernels::RedOp::kSum || red_op == kernels::RedOp::kAvg) && nnodes > 1;
}

namespace {

struct Unit {
  int owner = 0;
  uint64_t start = 0;  // elements
  uint64_t len = 0;
  uint64_t index = 0;  // within the owner's shard: the tag and the rail
};

constexpr uint64_t kWireAlign = 64;
uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

namespace {

// The shards: AllReduce cuts the element range into one shard per node (node o owns shard o);
// ReduceScatter's shards are the ranks' outputs, owned by the node of that rank. Each shard is cut
// into units of about chunk_bytes (whole int8 blocks from the shard's start), numbered per owner
// across its shards (the tag and the rail).
struct Shard {
  int owner = 0;
  uint64_t lo = 0, hi = 0;  // elements of the op's input
  int out_rank = -1;        // ReduceScatter: the rank whose output this is
};

absl::StatusOr<NodeSchedule> Build(const CommLayout& layout, int node, OpKind op, uint64_t count,
                                   kernels::DataType dtype, const kernels::Codec& codec,
                                   size_t chunk_bytes) {
  const int n = layout.nnodes;
  const bool gather = op == OpKind::kAllReduce;
  const char* what = gather ? "allreduce" : "reducescatter";
  if (codec.kind == kernels::CodecKind::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("the compressed ", what, " needs a codec other than none"));
  }
  if (n < 2 || node < 0 || node >= n || layout.ranks_of_node.size() != static_cast<size_t>(n) ||
      layout.ranks_of_node[node].empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the compressed ", what,
                                                   " runs across nodes; this layout has ", n,
                                                   " node(s) and node ", node, " holds no rank"));
  }
  if (!CompressionApplies(op, dtype, kernels::RedOp::kSum, n)) {
    return absl::InvalidArgumentError(absl::StrCat("the compressed ", what,
                                                   " takes float32, float16 or bfloat16 data, not ",
                                                   std::string(kernels::Name(dtype))));
  }
  // The data's element size; the partial and the codecs work in float32 (4 bytes an element).
  const uint64_t esize = kernels::ElementSize(dtype);
  const bool wide = dtype == kernels::DataType::kFloat32;
  const int rails = std::max(1, layout.rails);
  // Units are whole int8 blocks, so that each unit encodes as the whole would.
  const uint64_t align = codec.kind == kernels::CodecKind::kInt8 ? codec.block : 1;
  // Tags between two nodes number the receiver's units then the sender's: at most 2 * units.
  const uint64_t max_units = (tags::kDigestStep - 1) / 2;
  std::vector<Shard> shards;
  uint64_t total = count;  // elements of each rank's input
  if (gather) {
    for (int o = 0; o < n; ++o) {
      const uint64_t lo = o == 0 ? 0 : count * o / n / align * align;
      const uint64_t hi = o == n - 1 ? count : count * (o + 1) / n / align * align;
      if (hi > lo) shards.push_back({o, lo, hi, -1});
    }
  } else {
    if (count > 0 && static_cast<uint64_t>(layout.nranks) > UINT64_MAX / count) {
      return absl::InvalidArgumentError("the compressed reducescatter's input overflows");
    }
    total = count * static_cast<uint64_t>(layout.nranks);
    for (int r = 0; r < layout.nranks; ++r) {
      if (count > 0) {
        shards.push_back({layout.node_of_rank[r], r * count, (r + 1) * count, r});
      }
    }
  }
  // An owner's units number at most sum(len / unit + 1) over its shards: at most max_units when
  // unit >= its elements / (max_units - its shards).
  std::vector<uint64_t> owned(n, 0), shards_of(n, 0);
  for (const Shard& sh : shards) {
    owned[sh.owner] += sh.hi - sh.lo;
    ++shards_of[sh.owner];
  }
  std::vector<Unit> units;
  std::vector<uint64_t> units_of(n, 0);
  std::vector<int> out_rank_of_unit;
  for (const Shard& sh : shards) {
    const uint64_t len = sh.hi - sh.lo;
    uint64_t unit =
        chunk_bytes == 0 ? (len + rails - 1) / rails : std::max<uint64_t>(1, chunk_bytes / 4);
    const uint64_t room = max_units > shards_of[sh.owner] ? max_units - shards_of[sh.owner] : 1;
    unit = std::max<uint64_t>(unit, (owned[sh.owner] + room - 1) / room);
    unit = AlignUp(unit, align);
    for (uint64_t s = sh.lo; s < sh.hi; s += unit) {
      units.push_back({sh.owner, s, std::min(unit, sh.hi - s), units_of[sh.owner]++});
      out_rank_of_unit.push_back(sh.out_rank);
    }
  }
  for (uint64_t u : units_of) {
    if (u > max_units) {
      return absl::InvalidArgumentError(
          absl::StrCat("the compressed ", what, " of ", count, " elements needs ", u,
                       " units on one node, more than the ", max_units, " its tags number"));
    }
  }

  NodeSchedule out;
  out.node = node;
  out.residual_elems = total;
  const std::vector<int>& local = layout.ranks_of_node[node];
  const int r0 = local[0];
  auto scratch = [r0](uint64_t offset) { return RankRef{r0, RankRef::Space::kScratch, offset}; };
  uint64_t next = AlignUp(total * 4, kWireAlign);  // P: the node's float32 partial, then wire
  auto wire_area = [&](uint64_t bytes) {
    const uint64_t at = next;
    next = AlignUp(next + bytes, kWireAlign);
    return at;
  };
  // Steps are built in place (a NodeStep moved through a temporary trips GCC 12's
  // maybe-uninitialized on its inline deps).
  auto step = [&out](NodeStep::Kind kind, const RankRef& src, const RankRef& dst, uint64_t bytes,
                     std::initializer_list<uint32_t> deps) -> uint32_t {
    NodeStep& s = out.steps.emplace_back();
    s.kind = kind;
    s.src = src;
    s.dst = dst;
    s.bytes = bytes;
    s.deps.assign(deps.begin(), deps.end());
    return static_cast<uint32_t>(out.steps.size() - 1);
  };
  auto transfer = [&](NodeStep::Kind kind, const RankRef& buf, uint64_t wbytes, uint64_t dbytes,
                      int peer, int rail, uint64_t tag,
                      std::initializer_list<uint32_t> deps) -> uint32_t {
    const bool send = kind == NodeStep::Kind::kSend;
    const uint32_t i = step(kind, send ? buf : RankRef{}, send ? RankRef{} : buf, wbytes, deps);
    NodeStep& s = out.steps[i];
    s.aux = dbytes;
    s.peer = peer;
    s.rail = rail;
    s.tag = tag;
    return i;
  };
  using K = NodeStep::Kind;
  for (size_t ui = 0; ui < units.size(); ++ui) {
    const Unit& u = units[ui];
    const uint64_t fbytes = u.len * 4;
    const uint64_t dbytes = u.len * esize;  // what the exact path would send
    const uint64_t wbytes = kernels::EncodedBytes(codec, u.len);
    const RankRef p = scratch(u.start * 4);
    const int rail = static_cast<int>(u.index % rails);
    // 1. The node's exact partial (16-bit data widened to float32 as it is added).
    const RankRef send0{r0, RankRef::Space::kSend, u.start * esize};
    uint32_t last = step(wide ? K::kCopy : K::kWiden, send0, p, fbytes, {});
    for (size_t li = 1; li < local.size(); ++li) {
      last = step(wide ? K::kReduce : K::kWidenAdd,
                  RankRef{local[li], RankRef::Space::kSend, u.start * esize}, p, fbytes, {last});
    }
    uint32_t result = 0;  // the step after which P[u] holds the final (decoded) value
    if (u.owner == node) {
      // 2. Every peer's contribution, decoded and added in float32.
      for (int peer = 0; peer < n; ++peer) {
        if (peer == node) continue;
        const RankRef in = scratch(wire_area(wbytes));
        const uint32_t r = transfer(K::kRecv, in, wbytes, dbytes, peer, rail, u.index, {});
        last = step(K::kDecodeAdd, in, p, fbytes, {r, last});
      }
      result = last;
      if (gather) {
        // 3. The result, encoded once; this node keeps what it sends.
        const RankRef w = scratch(wire_area(wbytes));
        const uint32_t e = step(K::kEncode, p, w, fbytes, {last});
        out.steps[e].aux = u.start;
        result = step(K::kDecode, w, p, fbytes, {e});
        for (int peer = 0; peer < n; ++peer) {
          if (peer == node) continue;
          transfer(K::kSend, w, wbytes, dbytes, peer, rail, units_of[peer] + u.index, {e});
        }
      }
    } else {
      // 2. This node's contribution, encoded once, to the owner.
      const RankRef w = scratch(wire_area(wbytes));
      const uint32_t e = step(K::kEncode, p, w, fbytes, {last});
      out.steps[e].aux = u.start;
      transfer(K::kSend, w, wbytes, dbytes, u.owner, rail, u.index, {e});
      if (!gather) continue;  // a reducescatter's other shards end on their owners
      // 3. The owner's result; P[u] is read by the encode before the decode overwrites it.
      const RankRef in = scratch(wire_area(wbytes));
      const uint32_t r =
          transfer(K::kRecv, in, wbytes, dbytes, u.owner, rail, units_of[node] + u.index, {});
      result = step(K::kDecode, in, p, fbytes, {r, e});
    }
    // 4. The output (avg divides here, in float32, the same on every rank; 16-bit data is
    // rounded once, after the division): every local rank's for an AllReduce, the shard's rank's
    // for a ReduceScatter.
    auto output = [&](int g, uint64_t at) {
      const uint32_t c = step(wide ? K::kCopy : K::kNarrow, p,
                              RankRef{g, RankRef::Space::kRecv, at * esize}, fbytes, {result});
      out.steps[c].finalize = true;
    };
    if (gather) {
      for (int g : local) output(g, u.start);
    } else {
      const int g = out_rank_of_unit[ui];
      output(g, u.start - static_cast<uint64_t>(g) * count);
    }
  }
  out.scratch_bytes_per_rank = units.empty() ? 0 : next;
  out.scratch_first_rank_only = true;  // every scratch step is r0's
  return out;
}

}  // namespace

absl::StatusOr<NodeSchedule> BuildCompressedAllReduce(const CommLayout& layout, int node,
                                                      uint64_t count, kernels::DataType dtype,
                                                      const kernels::Codec& codec,
                                                      size_t chunk_bytes) {
  return Build(layout, node, OpKind::kAllReduce, count, dtype, codec, chunk_bytes);
}

absl::StatusOr<NodeSchedule> BuildCompressedReduceScatter(const CommLayout& layout, int node,
                                                          uint64_t count, kernels::DataType dtype,
                                                          const kernels::Codec& codec,
                                                          size_t chunk_bytes) {
  return Build(layout, node, OpKind::kReduceScatter, count, dtype, codec, chunk_bytes);
}

absl::Status RunCodecStep(NodeStep::Kind kind, const kernels::Codec& codec, const std::byte* src,
                          std::byte* dst, size_t n, float* residual) {
  if (kind == NodeStep::Kind::kEncode) {
    const auto* in = reinterpret_cast<const float*>(src);
    auto* out = reinterpret_cast<uint8_t*>(dst);
    if (residual != nullptr) {
      kernels::EncodeWithFeedback(codec, in, residual, n, out);
    } else {
      kernels::Encode(codec, in, n, out);
    }
    return absl::OkStatus();
  }
  const auto* in = reinterpret_cast<const uint8_t*>(src);
  auto* out = reinterpret_cast<float*>(dst);
  const size_t wire = kernels::EncodedBytes(codec, n);
  return kind == NodeStep::Kind::kDecode ? kernels::Decode(codec, in, wire, n, out)
                                         : kernels::DecodeAdd(codec, in, wire, n, out);
}

void RunConvertStep(NodeStep::Kind kind, kernels::DataType dtype, const std::byte* src,
                    std::byte* dst, size_t n, uint32_t divisor) {
  if (kind == NodeStep::Kind::kNarrow) {
    kernels::NarrowFromFloat(dtype, reinterpret_cast<const float*>(src), dst, n, divisor);
  } else {
    kernels::WidenToFloat(dtype, src, reinterpret_cast<float*>(dst), n,
                          kind == NodeStep::Kind::kWidenAdd);
  }
}

}  // namespace railyard::scheduler
