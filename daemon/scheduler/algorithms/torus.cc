// Dimension-ordered torus collectives. After the ReduceScatter phases 0..d-1 a rank owns data
// indexed by its own coordinates 0..d-1; phase d runs one ring per line of dimension d (the ranks
// that differ only in coordinate d, in coordinate order, so ring neighbours are torus
// neighbours) over what those ranks own in common.
//   AllReduce:     phase d splits the region the line owns into d_size blocks (SplitEven);
//                  member p keeps block p. AllGather replays the phases backwards.
//   ReduceScatter: the "blocks" are the count-element outputs of target ranks; phase d runs one
//                  ring per group of targets sharing coordinates d+1.., block b being the target
//                  with coordinate d = b. Partials live in scratch at target * count; the last
//                  phase lands each rank's own block in its recv.
//   AllGather:     the mirror image: phase d gathers, per group of sources sharing coordinates
//                  0..d-1, the blocks of the sources along the member's line.
#include "daemon/scheduler/algorithms/torus.h"

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/scheduler/algorithms/ring.h"

namespace railyard::scheduler::algorithms {
namespace {

class Torus {
 public:
  explicit Torus(ScheduleBuilder& b) : b_(b), dims_(b.layout().torus_dims) {
    stride_.resize(dims_.size());
    int s = 1;
    for (size_t d = 0; d < dims_.size(); ++d) {
      stride_[d] = s;
      s *= dims_[d];
    }
  }

  int ndims() const { return static_cast<int>(dims_.size()); }
  int Coord(int rank, int d) const { return rank / stride_[d] % dims_[d]; }
  // rank with coordinate d replaced by c.
  int With(int rank, int d, int c) const { return rank + (c - Coord(rank, d)) * stride_[d]; }
  // The first rank (coordinate d = 0) of every line of dimension d.
  std::vector<int> LineStarts(int d) const {
    std::vector<int> starts;
    for (int r = 0; r < b_.nranks(); ++r) {
      if (Coord(r, d) == 0) starts.push_back(r);
    }
    return starts;
  }
  void AllReduce() {
    const int n = b_.nranks();
    std::vector<Block> region(n, Block{0, b_.shape().count});
    // splits[d][line index]: the blocks of phase d's line.
    std::vector<std::vector<std::vector<Block>>> splits(ndims());
    for (int d = 0; d < ndims(); ++d) {
      const std::vector<int> starts = LineStarts(d);
      for (int start : starts) {
        const Block reg = region[start];
        const std::vector<Block> sub = SplitEven(reg.offset, reg.elems, dims_[d]);
        const auto member = [&](int p) { return With(start, d, p); };
        const auto in = [&](int p, int k) {
          return d == 0 ? b_.Send(member(p), sub[k].offset) : b_.Recv(member(p), sub[k].offset);
        };
        const auto acc = [&](int p, int k) { return b_.Recv(member(p), sub[k].offset); };
        RingReduceScatter(b_, in, acc, Lengths(sub), /*finalize=*/d + 1 == ndims());
        for (int p = 0; p < dims_[d]; ++p) region[member(p)] = sub[p];
        splits[d].push_back(sub);
      }
    }
    for (int d = ndims() - 1; d >= 0; --d) {
      const std::vector<int> starts = LineStarts(d);
      for (size_t li = 0; li < starts.size(); ++li) {
        const std::vector<Block>& sub = splits[d][li];
        const auto member = [&](int p) { return With(starts[li], d, p); };
        RingAllGather(
            b_, [&](int p) { return b_.Recv(member(p), sub[p].offset); },
            [&](int p, int k) { return b_.Recv(member(p), sub[k].offset); }, Lengths(sub));
      }
    }
  }

  void ReduceScatter() {
    const uint64_t c = b_.shape().count;
    for (int d = 0; d < ndims(); ++d) {
      const bool last = d + 1 == ndims();
      const std::vector<uint64_t> line_lens(dims_[d], c);
      for (int start : LineStarts(d)) {
        const auto member = [&](int p) { return With(start, d, p); };
        // Targets a member of this line holds partials for after phase d-1: coordinates < d
        // equal to the line's, the others free. Groups: coordinates > d fixed.
        for (int group : Groups(start, d)) {
          const auto target = [&](int k) { return With(group, d, k); };
          const auto in = [&](int p, int k) {
            const int t = target(k);
            return d == 0 ? b_.Send(member(p), t * c) : b_.Scratch(member(p), t * c);
          };
          const auto acc = [&](int p, int k) {
            const int t = target(k);
            return last && t == member(p) ? b_.Recv(t) : b_.Scratch(member(p), t * c);
          };
          RingReduceScatter(b_, in, acc, line_lens, /*finalize=*/last);
        }
      }
    }
  }

  void AllGather() {
    const uint64_t c = b_.shape().count;
    for (int d = 0; d < ndims(); ++d) {
      const std::vector<uint64_t> line_lens(dims_[d], c);
      for (int start : LineStarts(d)) {
        const auto member = [&](int p) { return With(start, d, p); };
        // Sources a member holds after phase d-1: coordinates >= d equal to its own. Groups:
        // coordinates < d fixed; block k is the source with coordinate d = k.
        for (int group : SourceGroups(start, d)) {
          const auto source = [&](int k) { return With(group, d, k); };
          RingAllGather(
              b_,
              [&](int p) {
                return d == 0 ? b_.Send(member(p)) : b_.Recv(member(p), source(p) * c);
              },
              [&](int p, int k) { return b_.Recv(member(p), source(k) * c); }, line_lens);
        }
      }
    }
  }

 private:
  // ReduceScatter phase d on the line starting at `start`: one representative target per group,
  // coordinates < d taken from the line, coordinate d = 0, coordinates > d enumerated.
  std::vector<int> Groups(int start, int d) const {
    int base = 0;
    for (int e = 0; e < d; ++e) base += Coord(start, e) * stride_[e];
    std::vector<int> groups = {base};
    for (int e = d + 1; e < ndims(); ++e) groups = Expand(groups, e);
    return groups;
  }
  // AllGather phase d: coordinates > d from the line, coordinate d = 0, coordinates < d free.
  std::vector<int> SourceGroups(int start, int d) const {
    int base = 0;
    for (int e = d + 1; e < ndims(); ++e) base += Coord(start, e) * stride_[e];
    std::vector<int> groups = {base};
    for (int e = 0; e < d; ++e) groups = Expand(groups, e);
    return groups;
  }
  // Every rank of `ranks` with coordinate e (0 in each) set to 0..dims[e]-1.
  std::vector<int> Expand(const std::vector<int>& ranks, int e) const {
    std::vector<int> out;
    out.reserve(ranks.size() * dims_[e]);
    for (int r : ranks) {
      for (int k = 0; k < dims_[e]; ++k) out.push_back(r + k * stride_[e]);
    }
    return out;
  }

  ScheduleBuilder& b_;
  const std::vector<int>& dims_;
  std::vector<int> stride_;
};

}  // namespace

absl::Status CheckTorusLayout(const CommLayout& l) {
  if (l.torus_dims.empty()) {
    return absl::InvalidArgumentError(
        "torus needs a torus layout (torus_dims, e.g. from a torus fabric); this communicator "
        "has none");
  }
  int64_t product = 1;
  for (int d : l.torus_dims) {
    if (d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("torus dimension ", d, " < 1 in ", absl::StrJoin(l.torus_dims, "x")));
    }
    product *= d;
    if (product > l.nranks) break;
  }
  if (product != l.nranks) {
    return absl::InvalidArgumentError(absl::StrCat("torus ", absl::StrJoin(l.torus_dims, "x"),
                                                   " does not hold the ", l.nranks, " ranks"));
  }
  if (l.nnodes != l.nranks) {
    return absl::InvalidArgumentError(absl::StrCat("torus needs one rank per node (", l.nranks,
                                                   " ranks on ", l.nnodes, " nodes)"));
  }
  return absl::OkStatus();
}

absl::Status GenerateTorus(ScheduleBuilder& b) {
  if (auto s = CheckTorusLayout(b.layout()); !s.ok()) return s;
  Torus t(b);
  switch (b.shape().op) {
    case OpKind::kAllReduce:
      t.AllReduce();
      return absl::OkStatus();
    case OpKind::kReduceScatter:
      t.ReduceScatter();
      return absl::OkStatus();
    case OpKind::kAllGather:
      t.AllGather();
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError("torus implements allreduce, reducescatter, allgather");
  }
}

}  // namespace railyard::scheduler::algorithms
