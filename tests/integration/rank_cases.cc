#include "tests/integration/rank_cases.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/kernels/reduce.h"

namespace railyard::testing {
namespace {

const char* OpName(CaseOp op) {
  switch (op) {
    case CaseOp::kAllReduce:
      return "allreduce";
    case CaseOp::kReduceScatter:
      return "reducescatter";
    case CaseOp::kAllGather:
      return "allgather";
    case CaseOp::kBroadcast:
      return "broadcast";
    case CaseOp::kReduce:
      return "reduce";
    case CaseOp::kAllToAll:
      return "alltoall";
    case CaseOp::kAllToAllv:
      return "alltoallv";
    case CaseOp::kSendRecv:
      return "sendrecv";
    case CaseOp::kBarrier:
      return "barrier";
  }
  return "?";
}

constexpr uint64_t kCounts[] = {0, 1, 7, 1001, 65537};
constexpr uint64_t kMaxCount = 65537;

// Input element k of rank r: small integers, exact in every dtype.
int64_t InputValue(int rank, uint64_t k, RedOp op) {
  if (op == RedOp::kProd) return static_cast<int64_t>((rank + k) % 2 + 1);
  return static_cast<int64_t>((static_cast<uint64_t>(rank) * 7 + k * 3) % 5);
}

// Writes integer-valued v (or, for floats, the float v) as dtype at p[i].
void Store(DataType t, void* p, uint64_t i, double v) {
  switch (t) {
    case DataType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      static_cast<double*>(p)[i] = v;
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(p)[i] = kernels::FloatToHalf(static_cast<float>(v));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(p)[i] = kernels::FloatToBFloat16(static_cast<float>(v));
      break;
    case DataType::kInt8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(static_cast<int64_t>(v));
      break;
    case DataType::kUint8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(v));
      break;
    case DataType::kUint32:
      static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(static_cast<int64_t>(v));
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kUint64:
      static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(static_cast<int64_t>(v));
      break;
  }
}

bool IsFloat(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 ||
         t == DataType::kBFloat16;
}

// The reduction of element k over all ranks, as the daemon must compute it (docs/local-api.md):
// exact integer arithmetic, then avg divided in float32 (float64 for double) or truncated.
double Reduced(const Case& c, int nranks, uint64_t k) {
  int64_t acc = InputValue(0, k, c.red_op);
  for (int r = 1; r < nranks; ++r) {
    const int64_t v = InputValue(r, k, c.red_op);
    switch (c.red_op) {
      case RedOp::kSum:
      case RedOp::kAvg:
        acc += v;
        break;
      case RedOp::kProd:
        acc *= v;
        break;
      case RedOp::kMin:
        acc = std::min(acc, v);
        break;
      case RedOp::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  if (c.red_op != RedOp::kAvg) return static_cast<double>(acc);
  if (c.dtype == DataType::kFloat64) return static_cast<double>(acc) / nranks;
  if (IsFloat(c.dtype))
    return static_cast<double>(static_cast<float>(acc) / static_cast<float>(nranks));
  return static_cast<double>(acc / nranks);
}

// Compares element i of `got` with value v stored as dtype (byte-exact).
bool Matches(DataType t, const std::byte* got, uint64_t i, double v) {
  std::byte want[8];
  Store(t, want, 0, v);
  const size_t e = kernels::ElementSize(t);
  return std::memcmp(got + i * e, want, e) == 0;
}

// AllToAllv block sizes: symmetric for in-place runs (send counts must equal recv counts there).
uint64_t VCount(int from, int to, uint64_t count, bool symmetric) {
  if (symmetric) return (static_cast<uint64_t>(from + to) + count) % 4 + count / 8;
  return (static_cast<uint64_t>(from * 3 + to) + count) % 5 + count / 8;
}

}  // namespace

std::string Case::Describe() const {
  return absl::StrCat(OpName(op), " dtype=", std::string(kernels::Name(dtype)),
                      " redop=", std::string(kernels::Name(red_op)), " count=", count,
                      in_place ? " in-place" : " out-of-place", " root=", root);
}

std::vector<Case> AllCases(int nranks) {
  std::vector<Case> cases;
  const DataType all_types[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                                DataType::kBFloat16, DataType::kInt8,    DataType::kUint8,
                                DataType::kInt32,    DataType::kUint32,  DataType::kInt64,
                                DataType::kUint64};
  const RedOp all_ops[] = {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax, RedOp::kAvg};
  const int root = nranks > 1 ? nranks - 1 : 0;
  for (bool in_place : {false, true}) {
    // Reductions: every dtype x redop at two odd counts, all counts for float sum.
    for (CaseOp op : {CaseOp::kAllReduce, CaseOp::kReduceScatter, CaseOp::kReduce}) {
      for (DataType t : all_types) {
        for (RedOp r : all_ops) {
          for (uint64_t count : {uint64_t{7}, uint64_t{1001}}) {
            cases.push_back({op, t, r, count, in_place, root});
          }
        }
      }
      for (uint64_t count : kCounts) {
        cases.push_back({op, DataType::kFloat32, RedOp::kSum, count, in_place, root});
        cases.push_back({op, DataType::kBFloat16, RedOp::kAvg, count, in_place, 0});
      }
    }
    for (CaseOp op : {CaseOp::kAllGather, CaseOp::kBroadcast, CaseOp::kAllToAll, CaseOp::kAllToAllv,
                      CaseOp::kSendRecv}) {
      if (op == CaseOp::kSendRecv && (in_place || nranks == 1)) continue;
      for (DataType t :
           {DataType::kFloat32, DataType::kFloat16, DataType::kInt8, DataType::kUint64}) {
        for (uint64_t count : kCounts) cases.push_back({op, t, RedOp::kSum, count, in_place, root});
      }
    }
  }
  cases.push_back({CaseOp::kBarrier, DataType::kFloat32, RedOp::kSum, 0, false, 0});
  return cases;
}

size_t ScratchBytes(int nranks) {
  // Send and recv regions of the largest case: nranks x (count + block slack) x 8 bytes each.
  return 2 * (static_cast<size_t>(nranks) * (kMaxCount + kMaxCount / 8 + 16) + 64) * 8;
}

absl::StatusOr<uint64_t> RunCase(Comm& comm, Buffer& buf, const Case& c) {
  const int n = comm.nranks();
  const int r = comm.rank();
  const size_t e = kernels::ElementSize(c.dtype);
  const uint64_t cnt = c.count;
  const size_t half = buf.size() / 2 / 64 * 64;
  std::byte* base = static_cast<std::byte*>(buf.data());
  std::memset(base, 0xA5, buf.size());  // poison: stale bytes never pass a check
  size_t send_off = 0;
  size_t recv_off = half;
  auto in = [&](uint64_t k) { return static_cast<double>(InputValue(r, k, c.red_op)); };
  auto fill = [&](size_t off, uint64_t elems) {
    for (uint64_t k = 0; k < elems; ++k) Store(c.dtype, base + off, k, in(k));
  };
  uint64_t wrong = 0;
  auto check = [&](size_t off, uint64_t i, double v) {
    if (!Matches(c.dtype, base + off, i, v)) ++wrong;
  };
  Work w;
  switch (c.op) {
    case CaseOp::kAllReduce:
    case CaseOp::kReduce: {
      if (c.in_place) send_off = recv_off;
      fill(send_off, cnt);
      w = c.op == CaseOp::kAllReduce
              ? comm.AllReduce({buf, send_off}, {buf, recv_off}, cnt, c.dtype, c.red_op)
              : comm.Reduce({buf, send_off}, {buf, recv_off}, cnt, c.dtype, c.red_op, c.root);
      if (absl::Status s = w.wait(std::chrono::seconds(60)); !s.ok()) return s;
      if (c.op == CaseOp::kAllReduce || r == c.root) {
        for (uint64_t k = 0; k < cnt; ++k) check(recv_off, k, Reduced(c, n, k));
      }
      break;
    }
    case CaseOp::kReduceScatter: {
      if (c.in_place) recv_off = send_off + r * cnt * e;
      fill(send_off, n * cnt);
      w = comm.ReduceScatter({buf, send_off}, {buf, recv_off}, cnt, c.dtype, c.red_op);
      if (absl::Status s = w.wait(std::chrono::seconds(60)); !s.ok()) return s;
      for (uint64_t k = 0; k < cnt; ++k) check(recv_off, k, Reduced(c, n, r * cnt + k));
      break;
    }
    case CaseOp::kAllGather: {
      if (c.in_place) send_off = recv_off + r * cnt * e;
      fill(send_off, cnt);
      w = comm.AllGather({buf, send_off}, {buf, recv_off}, cnt, c.dtype);
      if (absl::Status s = w.wait(std::chrono::seconds(60)); !s.ok()) return s;
      for (int j = 0; j < n; ++j) {
        for (uint64_t k = 0; k < cnt; ++k) {
          check(recv_off, j * cnt + k, static_cast<double>(InputValue(j, k, c.red_op)));
        }
      }
      break;
    }
    case CaseOp::kBroadcast: {
      if (c.in_place) send_off = recv_off;
      if (r == c.root) fill(send_off, cnt);
      w = comm.Broadcast({buf, send_off}, {buf, recv_off}, cnt, c.dtype, c.root);
      if (absl::Status s = w.wait(std::chrono::seconds(60)); !s.ok()) return s;
      for (uint64_t k = 0; k < cnt; ++k) {
        check(recv_off, k, static_cast<double>(InputValue(c.root, k, c.red_op)));
      }
      break;
    }
    case CaseOp::kAllToAll: {
      if (c.in_place) send_off = recv_off;
      fill(send_off, n * cnt);
      w = comm.AllToAll({buf, send_off}, {buf, recv_off}, cnt, c.dtype);
      if (absl::Status s = w.wait(std::chrono::seconds(60)); !s.ok()) return s;
      // Block j of my output is block r of rank j's input.
      for (int j = 0; j < n; ++j) {
        for (uint64_t k = 0; k < cnt; ++k) {
          check(recv_off, j * cnt + k, static_cast<double>(InputValue(j, r * cnt + k, c.red_op)));
        }
      }
      break;
    }
    case CaseOp::kAllToAllv: {
      const bool sym = c.in_place;
      std::vector<uint64_t> sc(n), sd(n), rc(n), rd(n);
      uint64_t spos = 1, rpos = 2;  // gaps of unused elements between blocks exercise displs
      for (int j = 0; j < n; ++j) {
        sc[j] = VCount(r, j, cnt, sym);
        sd[j] = spos;
        spos += sc[j] + 1;
        rc[j] = VCount(j, r, cnt, sym);
        rd[j] = rpos;
        rpos += rc[j] + 2;
      }
      if (c.in_place) {
        send_off = recv_off;
        rd = sd;
      }
      // Element k of the block for peer j carries value in(sd[j] + k).
      for (int j = 0; j < n; ++j) {
        for (uint64_t k = 0; k < sc[j]; ++k) {
          Store(c.dtype, base + send_off, sd[j] + k, in(sd[j] + k));
        }
      }
      w = comm.AllToAllv({buf, send_off}, sc, sd, {buf, recv_off}, rc, rd, c.dtype);
      if (absl::Status s = w.wait(std::chrono::seconds(60)); !s.ok()) return s;
      for (int j = 0; j < n; ++j) {
        // Rank j's send displacement for me, recomputed from its layout.
        uint64_t jpos = 1;
        for (int i = 0; i < r; ++i) jpos += VCount(j, i, cnt, sym) + 1;
        for (uint64_t k = 0; k < rc[j]; ++k) {
          check(recv_off, rd[j] + k, static_cast<double>(InputValue(j, jpos + k, c.red_op)));
        }
      }
      break;
    }
    case CaseOp::kSendRecv: {
      const int to = (r + 1) % n;
      const int from = (r + n - 1) % n;
      fill(send_off, cnt);
      Work ws = comm.Send({buf, send_off}, cnt, c.dtype, to);
      Work wr = comm.Recv({buf, recv_off}, cnt, c.dtype, from);
      if (absl::Status s = ws.wait(std::chrono::seconds(60)); !s.ok()) return s;
      if (absl::Status s = wr.wait(std::chrono::seconds(60)); !s.ok()) return s;
      for (uint64_t k = 0; k < cnt; ++k) {
        check(recv_off, k, static_cast<double>(InputValue(from, k, c.red_op)));
      }
      break;
    }
    case CaseOp::kBarrier: {
      w = comm.Barrier();
      if (absl::Status s = w.wait(std::chrono::seconds(60)); !s.ok()) return s;
      break;
    }
  }
  return wrong;
}

}  // namespace railyard::testing
