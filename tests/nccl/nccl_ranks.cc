// One rank of an NCCL program, compiled against the CUDA toolkit's nccl.h and linked to
// railyard's libnccl.so.2 (client/nccl), on host memory. nccl_api_test.py runs 4 of them on 2
// daemons. Every result is checked against a reference computed here; each failure is printed
// and the exit code is the number of failures (capped).
//
// Environment: NCCL_TEST_RANK, NCCL_TEST_NRANKS, NCCL_TEST_DIR (where rank 0 publishes unique
// ids for the others), NCCL_TEST_PARTS (comma list; default all): matrix, group, p2p, split,
// shrink, nonblocking, premulsum, errors, initall, abort; and "device" (not in "all"), on a GPU:
// the same checks on cudaMalloc'd and ncclMemAlloc'd device memory ordered on a CUDA stream,
// every rank on device 0 (scripts/device-check.sh, step nccl; its daemons run with --cuda_ipc).
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "client/nccl/nccl_convert.h"

namespace {

int g_rank = 0, g_nranks = 1, g_failures = 0, g_cases = 0;
std::string g_dir;

#define EXPECT(cond, ...)                                                       \
  do {                                                                          \
    ++g_cases;                                                                  \
    if (!(cond)) {                                                              \
      ++g_failures;                                                             \
      std::fprintf(stderr, "rank %d FAIL %s:%d: ", g_rank, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                        \
      std::fprintf(stderr, "\n");                                               \
    }                                                                           \
  } while (0)

#define CHECK_NCCL(call)                                                                         \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    if (r_ != ncclSuccess) {                                                                     \
      std::fprintf(stderr, "rank %d FATAL %s: %s (%s)\n", g_rank, #call, ncclGetErrorString(r_), \
                   ncclGetLastError(nullptr));                                                   \
      std::exit(100);                                                                            \
    }                                                                                            \
  } while (0)

// Rank 0 makes an id and publishes it under `name`; the others read it (bounded wait).
ncclUniqueId SharedId(const std::string& name) {
  const std::string path = g_dir + "/" + name;
  ncclUniqueId id;
  if (g_rank == 0) {
    CHECK_NCCL(ncclGetUniqueId(&id));
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(id.internal, sizeof(id.internal));
    std::rename(tmp.c_str(), path.c_str());
    return id;
  }
  for (int i = 0; i < 3000; ++i) {
    std::ifstream in(path, std::ios::binary);
    if (in && in.read(id.internal, sizeof(id.internal))) return id;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "rank %d FATAL: no unique id %s after 30 s\n", g_rank, path.c_str());
  std::exit(101);
}

ncclComm_t Init(const std::string& name, int nranks, int rank) {
  ncclComm_t comm = nullptr;
  CHECK_NCCL(ncclCommInitRank(&comm, nranks, SharedId(name), rank));
  return comm;
}

// Elements as doubles, whatever the type.
double Get(const void* p, size_t i, ncclDataType_t t) {
  using railyard::nccl::Bf16ToFloat;
  using railyard::nccl::HalfToFloat;
  switch (t) {
    case ncclInt8:
      return static_cast<const int8_t*>(p)[i];
    case ncclUint8:
      return static_cast<const uint8_t*>(p)[i];
    case ncclInt32:
      return static_cast<const int32_t*>(p)[i];
    case ncclUint32:
      return static_cast<const uint32_t*>(p)[i];
    case ncclInt64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case ncclUint64:
      return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case ncclFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case ncclBfloat16:
      return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case ncclFloat32:
      return static_cast<const float*>(p)[i];
    case ncclFloat64:
      return static_cast<const double*>(p)[i];
    default:
      return NAN;
  }
}

void Set(void* p, size_t i, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    case ncclUint8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case ncclInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case ncclUint32:
      static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v);
      break;
    case ncclInt64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case ncclUint64:
      static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v);
      break;
    case ncclFloat16:
      static_cast<uint16_t*>(p)[i] = railyard::nccl::FloatToHalf(static_cast<float>(v));
      break;
    case ncclBfloat16:
      static_cast<uint16_t*>(p)[i] = railyard::nccl::FloatToBf16(static_cast<float>(v));
      break;
    case ncclFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case ncclFloat64:
      static_cast<double*>(p)[i] = v;
      break;
    default:
      break;
  }
}

bool IsInt(ncclDataType_t t) { return t <= ncclUint64; }

// Rank r's element i: small positive integers, so that sums, products (of at most 4 values
// at most 3) and averages of 4 are exact in every type.
double Input(int r, size_t i, ncclRedOp_t op) {
  if (op == ncclProd) return static_cast<double>((r + i) % 3 + 1);
  return static_cast<double>((r * 7 + i * 3) % 11 + 1);
}

double Reduce(size_t i, ncclRedOp_t op, ncclDataType_t t, size_t shift = 0) {
  double acc = Input(0, i + shift, op);
  for (int r = 1; r < g_nranks; ++r) {
    const double v = Input(r, i + shift, op);
    switch (op) {
      case ncclSum:
      case ncclAvg:
        acc += v;
        break;
      case ncclProd:
        acc *= v;
        break;
      case ncclMax:
        acc = std::max(acc, v);
        break;
      case ncclMin:
        acc = std::min(acc, v);
        break;
      default:
        break;
    }
  }
  if (op == ncclAvg) acc = IsInt(t) ? std::floor(acc / g_nranks) : acc / g_nranks;
  return acc;
}

bool Close(double got, double want, ncclDataType_t t) {
  if (IsInt(t)) return got == want;
  const double tol = (t == ncclFloat16 || t == ncclBfloat16) ? 0.02 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

// Memory for a case: plain host memory (staged by the library) or ncclMemAlloc's (zero copy).
struct Mem {
  bool shared = false;
  void* p = nullptr;
  Mem(size_t bytes, bool use_memalloc) : shared(use_memalloc) {
    if (shared) {
      CHECK_NCCL(ncclMemAlloc(&p, bytes));
    } else {
      p = std::malloc(bytes);
    }
    std::memset(p, 0xee, bytes);
  }
  ~Mem() {
    if (shared) {
      ncclMemFree(p);
    } else {
      std::free(p);
    }
  }
};

const ncclDataType_t kTypes[] = {ncclInt8,   ncclUint8,   ncclInt32,   ncclUint32,  ncclInt64,
                                 ncclUint64, ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
const ncclRedOp_t kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};

void Matrix(ncclComm_t comm) {
  const size_t count = 1000 + 3;  // odd: no type's chunking lines up
  const int n = g_nranks;
  int root = 0;
  for (bool memalloc : {false, true}) {
    for (ncclDataType_t t : kTypes) {
      const size_t e = railyard::nccl::ElementBytes(t);
      for (bool in_place : {false, true}) {
        for (int oi = 0; oi < 5; ++oi) {
          const ncclRedOp_t op = kOps[oi];
          // AllReduce
          {
            Mem s(count * e, memalloc), r(count * e, memalloc);
            for (size_t i = 0; i < count; ++i) Set(s.p, i, t, Input(g_rank, i, op));
            void* out = in_place ? s.p : r.p;
            CHECK_NCCL(ncclAllReduce(s.p, out, count, t, op, comm, nullptr));
            size_t bad = 0;
            for (size_t i = 0; i < count; ++i) bad += !Close(Get(out, i, t), Reduce(i, op, t), t);
            EXPECT(bad == 0, "AllReduce type %d %s in_place %d memalloc %d: %zu wrong", t,
                   kOpNames[oi], in_place, memalloc, bad);
          }
          // Reduce, root rotating
          {
            root = (root + 1) % n;
            Mem s(count * e, memalloc), r(count * e, memalloc);
            for (size_t i = 0; i < count; ++i) Set(s.p, i, t, Input(g_rank, i, op));
            void* out = in_place ? s.p : r.p;
            CHECK_NCCL(ncclReduce(s.p, out, count, t, op, root, comm, nullptr));
            if (g_rank == root) {
              size_t bad = 0;
              for (size_t i = 0; i < count; ++i) bad += !Close(Get(out, i, t), Reduce(i, op, t), t);
              EXPECT(bad == 0, "Reduce root %d type %d %s in_place %d: %zu wrong", root, t,
                     kOpNames[oi], in_place, bad);
            }
          }
          // ReduceScatter: rank r's block is elements [r*count, (r+1)*count).
          {
            Mem s(count * e * n, memalloc), r(count * e, memalloc);
            for (size_t i = 0; i < count * n; ++i) Set(s.p, i, t, Input(g_rank, i, op));
            void* out = in_place ? static_cast<char*>(s.p) + g_rank * count * e : r.p;
            CHECK_NCCL(ncclReduceScatter(s.p, out, count, t, op, comm, nullptr));
            size_t bad = 0;
            for (size_t i = 0; i < count; ++i) {
              bad += !Close(Get(out, i, t), Reduce(i, op, t, g_rank * count), t);
            }
            EXPECT(bad == 0, "ReduceScatter type %d %s in_place %d: %zu wrong", t, kOpNames[oi],
                   in_place, bad);
          }
        }
        // Broadcast (and in-place Bcast)
        {
          root = (root + 1) % n;
          Mem s(count * e, memalloc), r(count * e, memalloc);
          for (size_t i = 0; i < count; ++i) Set(s.p, i, t, Input(g_rank, i, ncclSum));
          if (in_place) {
            CHECK_NCCL(ncclBcast(s.p, count, t, root, comm, nullptr));
          } else {
            CHECK_NCCL(ncclBroadcast(s.p, r.p, count, t, root, comm, nullptr));
          }
          void* out = in_place ? s.p : r.p;
          size_t bad = 0;
          for (size_t i = 0; i < count; ++i) bad += Get(out, i, t) != Input(root, i, ncclSum);
          EXPECT(bad == 0, "Broadcast root %d type %d in_place %d: %zu wrong", root, t, in_place,
                 bad);
        }
        // AllGather: in place, the send block is the rank's block of the output.
        {
          Mem s(count * e, memalloc), r(count * e * n, memalloc);
          void* send = in_place ? static_cast<char*>(r.p) + g_rank * count * e : s.p;
          for (size_t i = 0; i < count; ++i) Set(send, i, t, Input(g_rank, i, ncclSum));
          CHECK_NCCL(ncclAllGather(send, r.p, count, t, comm, nullptr));
          size_t bad = 0;
          for (int q = 0; q < n; ++q) {
            for (size_t i = 0; i < count; ++i)
              bad += Get(r.p, q * count + i, t) != Input(q, i, ncclSum);
          }
          EXPECT(bad == 0, "AllGather type %d in_place %d: %zu wrong", t, in_place, bad);
        }
        // AllToAll: block q of rank r goes to rank q's block r.
        if (!in_place) {
          Mem s(count * e * n, memalloc), r(count * e * n, memalloc);
          for (size_t i = 0; i < count * n; ++i) Set(s.p, i, t, Input(g_rank, i, ncclSum));
          CHECK_NCCL(ncclAlltoAll(s.p, r.p, count, t, comm, nullptr));
          size_t bad = 0;
          for (int q = 0; q < n; ++q) {
            for (size_t i = 0; i < count; ++i) {
              bad += Get(r.p, q * count + i, t) != Input(q, g_rank * count + i, ncclSum);
            }
          }
          EXPECT(bad == 0, "AlltoAll type %d: %zu wrong", t, bad);
        }
      }
    }
  }
  // Gather and Scatter (float), one large AllReduce (4 MiB).
  {
    const size_t c = 257;
    std::vector<float> s(c), g(c * n, -1), sc(c * n), out(c, -1);
    for (size_t i = 0; i < c; ++i) s[i] = static_cast<float>(g_rank * 1000 + i);
    for (size_t i = 0; i < c * n; ++i) sc[i] = static_cast<float>(i * 2);
    const int gr = 1 % n;
    CHECK_NCCL(ncclGather(s.data(), g.data(), c, ncclFloat32, gr, comm, nullptr));
    if (g_rank == gr) {
      size_t bad = 0;
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < c; ++i) bad += g[q * c + i] != static_cast<float>(q * 1000 + i);
      }
      EXPECT(bad == 0, "Gather: %zu wrong", bad);
    }
    CHECK_NCCL(ncclScatter(sc.data(), out.data(), c, ncclFloat32, 0, comm, nullptr));
    size_t bad = 0;
    for (size_t i = 0; i < c; ++i) bad += out[i] != static_cast<float>((g_rank * c + i) * 2);
    EXPECT(bad == 0, "Scatter: %zu wrong", bad);
    const size_t big = size_t{1} << 20;
    std::vector<float> a(big, static_cast<float>(g_rank + 1));
    CHECK_NCCL(ncclAllReduce(a.data(), a.data(), big, ncclFloat32, ncclSum, comm, nullptr));
    const float want = static_cast<float>(n * (n + 1) / 2);
    bad = 0;
    for (float v : a) bad += v != want;
    EXPECT(bad == 0, "4 MiB AllReduce: %zu wrong", bad);
  }
}

// Several collectives in one group, then a send/recv ring in a group (the only deadlock-free
// way with NCCL's blocking semantics), and both directions at once.
void Group(ncclComm_t comm) {
  const int n = g_nranks;
  const size_t c = 333;
  std::vector<std::vector<int32_t>> bufs(5, std::vector<int32_t>(c));
  for (int k = 0; k < 5; ++k) {
    for (size_t i = 0; i < c; ++i) bufs[k][i] = g_rank + k * 10 + static_cast<int32_t>(i);
  }
  CHECK_NCCL(ncclGroupStart());
  for (int k = 0; k < 5; ++k) {
    CHECK_NCCL(ncclAllReduce(bufs[k].data(), bufs[k].data(), c, ncclInt32, ncclSum, comm, nullptr));
  }
  CHECK_NCCL(ncclGroupEnd());
  for (int k = 0; k < 5; ++k) {
    size_t bad = 0;
    for (size_t i = 0; i < c; ++i) {
      bad += bufs[k][i] != n * (n - 1) / 2 + n * (k * 10 + static_cast<int32_t>(i));
    }
    EXPECT(bad == 0, "group AllReduce %d: %zu wrong", k, bad);
  }
  // Nested groups submit at the outermost end.
  std::vector<double> x(c, g_rank + 1.0);
  CHECK_NCCL(ncclGroupStart());
  CHECK_NCCL(ncclGroupStart());
  CHECK_NCCL(ncclAllReduce(x.data(), x.data(), c, ncclFloat64, ncclMax, comm, nullptr));
  CHECK_NCCL(ncclGroupEnd());
  CHECK_NCCL(ncclGroupEnd());
  EXPECT(x[0] == n && x[c - 1] == n, "nested group max: %f", x[0]);
}

void P2p(ncclComm_t comm) {
  const int n = g_nranks;
  const size_t c = 4099;
  const int next = (g_rank + 1) % n, prev = (g_rank + n - 1) % n;
  for (int round = 0; round < 3; ++round) {
    std::vector<int64_t> out(c), from_prev(c, -1), from_next(c, -1);
    for (size_t i = 0; i < c; ++i)
      out[i] = g_rank * 100000 + round * 10000 + static_cast<int64_t>(i);
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclSend(out.data(), c, ncclInt64, next, comm, nullptr));
    CHECK_NCCL(ncclSend(out.data(), c, ncclInt64, prev, comm, nullptr));
    CHECK_NCCL(ncclRecv(from_prev.data(), c, ncclInt64, prev, comm, nullptr));
    CHECK_NCCL(ncclRecv(from_next.data(), c, ncclInt64, next, comm, nullptr));
    CHECK_NCCL(ncclGroupEnd());
    size_t bad = 0;
    for (size_t i = 0; i < c; ++i) {
      bad += from_prev[i] != prev * 100000 + round * 10000 + static_cast<int64_t>(i);
      bad += from_next[i] != next * 100000 + round * 10000 + static_cast<int64_t>(i);
    }
    EXPECT(bad == 0, "send/recv both ways round %d: %zu wrong", round, bad);
  }
}

void Split(ncclComm_t comm) {
  // Two colors by parity, keyed in reverse; a rank that opts out gets NULL.
  ncclComm_t child = nullptr;
  const int color = g_rank % 2;
  CHECK_NCCL(ncclCommSplit(comm, color, -g_rank, &child, nullptr));
  int count = 0, rank = -1;
  CHECK_NCCL(ncclCommCount(child, &count));
  CHECK_NCCL(ncclCommUserRank(child, &rank));
  int members = 0;
  for (int r = 0; r < g_nranks; ++r) members += r % 2 == color;
  int above = 0;  // same color, larger parent rank: before me (key -rank)
  for (int r = g_rank + 1; r < g_nranks; ++r) above += r % 2 == color;
  EXPECT(count == members && rank == above, "split: count %d rank %d, want %d and %d", count, rank,
         members, above);
  int v = g_rank;
  CHECK_NCCL(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, child, nullptr));
  int want = 0;
  for (int r = 0; r < g_nranks; ++r) want += r % 2 == color ? r : 0;
  EXPECT(v == want, "split AllReduce: %d, want %d", v, want);
  CHECK_NCCL(ncclCommDestroy(child));
  // Only rank 0 opts in: the rest get NULL.
  ncclComm_t solo = nullptr;
  CHECK_NCCL(ncclCommSplit(comm, g_rank == 0 ? 0 : NCCL_SPLIT_NOCOLOR, 0, &solo, nullptr));
  EXPECT((g_rank == 0) == (solo != nullptr), "NOCOLOR split gave %p", static_cast<void*>(solo));
  if (solo != nullptr) {
    CHECK_NCCL(ncclCommCount(solo, &count));
    EXPECT(count == 1, "solo split has %d ranks", count);
    CHECK_NCCL(ncclCommDestroy(solo));
  }
}

void Shrink(ncclComm_t comm) {
  // The last rank leaves; the rest renumber and go on without exchanging an id.
  const int gone = g_nranks - 1;
  if (g_rank == gone) return;
  int exclude[1] = {gone};
  ncclComm_t child = nullptr;
  CHECK_NCCL(ncclCommShrink(comm, exclude, 1, &child, nullptr, NCCL_SHRINK_DEFAULT));
  int count = 0, rank = -1;
  CHECK_NCCL(ncclCommCount(child, &count));
  CHECK_NCCL(ncclCommUserRank(child, &rank));
  EXPECT(count == g_nranks - 1 && rank == g_rank, "shrink: count %d rank %d", count, rank);
  float v = 1.0f;
  CHECK_NCCL(ncclAllReduce(&v, &v, 1, ncclFloat32, ncclSum, child, nullptr));
  EXPECT(v == static_cast<float>(g_nranks - 1), "shrink AllReduce %f", v);
  CHECK_NCCL(ncclCommDestroy(child));
}

void NonBlocking() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, g_nranks, SharedId("nb"), g_rank, &config);
  EXPECT(r == ncclInProgress || r == ncclSuccess, "non-blocking init returned %d", r);
  ncclResult_t state = ncclInProgress;
  for (int i = 0; i < 60000 && state == ncclInProgress; ++i) {
    CHECK_NCCL(ncclCommGetAsyncError(comm, &state));
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT(state == ncclSuccess, "non-blocking init ended with %d", state);
  std::vector<float> a(100000, 1.0f);
  ncclResult_t launched =
      ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat32, ncclSum, comm, nullptr);
  EXPECT(launched == ncclSuccess || launched == ncclInProgress, "non-blocking launch %d", launched);
  state = ncclInProgress;
  for (int i = 0; i < 60000 && state == ncclInProgress; ++i) {
    CHECK_NCCL(ncclCommGetAsyncError(comm, &state));
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT(state == ncclSuccess && a[0] == g_nranks && a.back() == g_nranks,
         "non-blocking AllReduce: state %d a[0] %f", state, a[0]);
  ncclResult_t fin = ncclCommFinalize(comm);
  for (int i = 0; i < 60000 && fin == ncclInProgress; ++i) {
    CHECK_NCCL(ncclCommGetAsyncError(comm, &fin));
  }
  EXPECT(fin == ncclSuccess, "finalize %d", fin);
  CHECK_NCCL(ncclCommDestroy(comm));
}

void PreMulSum(ncclComm_t comm) {
  // sum over ranks of (scalar_r * x_r), scalar_r = r + 1, per-rank scalars as NCCL allows.
  for (ncclDataType_t t : {ncclFloat32, ncclFloat64, ncclInt32, ncclFloat16, ncclBfloat16}) {
    const size_t e = railyard::nccl::ElementBytes(t);
    std::vector<char> scalar(8), data(64 * e);
    Set(scalar.data(), 0, t, g_rank + 1);
    for (size_t i = 0; i < 64; ++i) Set(data.data(), i, t, static_cast<double>(i % 5));
    for (ncclScalarResidence_t res : {ncclScalarHostImmediate, ncclScalarDevice}) {
      ncclRedOp_t op;
      CHECK_NCCL(ncclRedOpCreatePreMulSum(&op, scalar.data(), t, res, comm));
      std::vector<char> out(64 * e);
      CHECK_NCCL(ncclAllReduce(data.data(), out.data(), 64, t, op, comm, nullptr));
      size_t bad = 0;
      const double k = g_nranks * (g_nranks + 1) / 2.0;
      for (size_t i = 0; i < 64; ++i) bad += !Close(Get(out.data(), i, t), k * (i % 5), t);
      EXPECT(bad == 0, "PreMulSum type %d residence %d: %zu wrong", t, res, bad);
      CHECK_NCCL(ncclRedOpDestroy(op, comm));
    }
  }
  ncclRedOp_t never = static_cast<ncclRedOp_t>(ncclNumOps + 40);
  EXPECT(ncclRedOpDestroy(never, comm) == ncclInvalidArgument, "destroying an unknown op");
}

// Each bad argument gets NCCL's code and a reason in ncclGetLastError; the communicator goes on.
void Errors(ncclComm_t comm) {
  float x[4] = {1, 2, 3, 4};
  auto expect = [&](ncclResult_t got, ncclResult_t want, const char* what) {
    const char* why = ncclGetLastError(comm);
    EXPECT(got == want && why != nullptr && std::strlen(why) > 0, "%s: got %d (%s) want %d: '%s'",
           what, got, ncclGetErrorString(got), want, why == nullptr ? "(null)" : why);
  };
  expect(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, nullptr, nullptr), ncclInvalidArgument,
         "NULL comm");
  expect(ncclAllReduce(x, x, 4, static_cast<ncclDataType_t>(99), ncclSum, comm, nullptr),
         ncclInvalidArgument, "bad datatype");
  expect(ncclAllReduce(x, x, 4, ncclFloat32, static_cast<ncclRedOp_t>(17), comm, nullptr),
         ncclInvalidArgument, "bad op");
  expect(ncclAllReduce(x, x, 4, ncclFloat8e4m3, ncclSum, comm, nullptr), ncclInvalidUsage,
         "float8");
  expect(ncclAllReduce(nullptr, x, 4, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidArgument,
         "NULL sendbuff");
  expect(ncclBroadcast(x, x, 4, ncclFloat32, g_nranks, comm, nullptr), ncclInvalidArgument,
         "root out of range");
  expect(ncclSend(x, 4, ncclFloat32, -1, comm, nullptr), ncclInvalidArgument, "peer -1");
  expect(ncclGroupEnd(), ncclInvalidUsage, "GroupEnd without GroupStart");
  ncclComm_t bad = nullptr;
  ncclUniqueId garbage;
  std::memset(&garbage, 0x41, sizeof(garbage));
  expect(ncclCommInitRank(&bad, 2, garbage, 0), ncclInvalidArgument, "foreign unique id");
  expect(ncclCommInitRank(&bad, 2, SharedId("unused"), 5), ncclInvalidArgument, "rank >= nranks");
  expect(ncclCommInitRank(&bad, 0, SharedId("unused"), 0), ncclInvalidArgument, "nranks 0");
  expect(ncclMemFree(x), ncclInvalidArgument, "MemFree of foreign memory");
  expect(ncclCommRevoke(comm, 0), ncclInvalidUsage, "Revoke");
  expect(ncclCommWindowRegister(comm, x, 16, nullptr, 0), ncclInvalidUsage, "WindowRegister");
  expect(ncclCommDeregister(comm, x), ncclInvalidArgument, "Deregister of a foreign handle");
  int v = 0;
  expect(ncclGetVersion(nullptr), ncclInvalidArgument, "GetVersion(NULL)");
  CHECK_NCCL(ncclGetVersion(&v));
  EXPECT(v == NCCL_VERSION_CODE, "version %d", v);
  EXPECT(std::strcmp(ncclGetErrorString(ncclInvalidUsage),
                     "invalid usage (run with NCCL_DEBUG=WARN for details)") == 0,
         "error string");
  // Registration is a hint: host memory registers (staged), MemAlloc'd memory zero-copies.
  void* handle = nullptr;
  CHECK_NCCL(ncclCommRegister(comm, x, sizeof(x), &handle));
  CHECK_NCCL(ncclCommDeregister(comm, handle));
  // Still usable after all that.
  float y = 1;
  CHECK_NCCL(ncclAllReduce(&y, &y, 1, ncclFloat32, ncclSum, comm, nullptr));
  EXPECT(y == g_nranks, "AllReduce after bad arguments: %f", y);
  ncclResult_t async = ncclInternalError;
  CHECK_NCCL(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "async error after bad arguments: %d", async);
  int dev = -1;
  CHECK_NCCL(ncclCommCuDevice(comm, &dev));
  EXPECT(dev >= 0, "CuDevice %d", dev);
}

// One process, all ranks (ncclCommInitAll): run from rank 0 only, on its own daemon.
void InitAll() {
  if (g_rank != 0) return;
  ncclComm_t comms[3] = {};
  CHECK_NCCL(ncclCommInitAll(comms, 3, nullptr));
  std::vector<std::vector<uint8_t>> b(3, std::vector<uint8_t>(77));
  for (int k = 0; k < 3; ++k) std::fill(b[k].begin(), b[k].end(), static_cast<uint8_t>(k + 1));
  CHECK_NCCL(ncclGroupStart());
  for (int k = 0; k < 3; ++k) {
    CHECK_NCCL(ncclAllReduce(b[k].data(), b[k].data(), 77, ncclUint8, ncclSum, comms[k], nullptr));
  }
  CHECK_NCCL(ncclGroupEnd());
  for (int k = 0; k < 3; ++k) {
    int rank = -1, dev = -1;
    CHECK_NCCL(ncclCommUserRank(comms[k], &rank));
    CHECK_NCCL(ncclCommCuDevice(comms[k], &dev));
    EXPECT(rank == k && dev == k && b[k][0] == 6 && b[k][76] == 6, "InitAll rank %d: %d %d %d", k,
           rank, dev, b[k][0]);
    CHECK_NCCL(ncclCommDestroy(comms[k]));
  }
  // The same by hand, as single-process multi-GPU NCCL code does: every rank's init from one
  // thread inside a group (each waits for the others: ncclGroupEnd waits for them all).
  ncclUniqueId id;
  CHECK_NCCL(ncclGetUniqueId(&id));
  CHECK_NCCL(ncclGroupStart());
  for (int k = 0; k < 3; ++k) CHECK_NCCL(ncclCommInitRank(&comms[k], 3, id, k));
  CHECK_NCCL(ncclGroupEnd());
  double d[3] = {1, 2, 4};
  CHECK_NCCL(ncclGroupStart());
  for (int k = 0; k < 3; ++k) {
    CHECK_NCCL(ncclAllReduce(&d[k], &d[k], 1, ncclFloat64, ncclSum, comms[k], nullptr));
  }
  CHECK_NCCL(ncclGroupEnd());
  EXPECT(d[0] == 7 && d[1] == 7 && d[2] == 7, "grouped inits: %f %f %f", d[0], d[1], d[2]);
  for (int k = 0; k < 3; ++k) CHECK_NCCL(ncclCommDestroy(comms[k]));
}

// The last rank aborts; the others' next operation fails with ncclRemoteError, and the
// asynchronous error says so too.
void Abort() {
  ncclComm_t comm = Init("abort", g_nranks, g_rank);
  float v = 1;
  CHECK_NCCL(ncclAllReduce(&v, &v, 1, ncclFloat32, ncclSum, comm, nullptr));
  if (g_rank == g_nranks - 1) {
    CHECK_NCCL(ncclCommAbort(comm));
    return;
  }
  const ncclResult_t r = ncclAllReduce(&v, &v, 1, ncclFloat32, ncclSum, comm, nullptr);
  EXPECT(r == ncclRemoteError, "AllReduce after a peer's abort: %d (%s)", r,
         ncclGetLastError(comm));
  ncclResult_t async = ncclSuccess;
  CHECK_NCCL(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclRemoteError, "async error after a peer's abort: %d", async);
  EXPECT(ncclAllReduce(&v, &v, 1, ncclFloat32, ncclSum, comm, nullptr) == ncclRemoteError,
         "a later call returns the async error");
  CHECK_NCCL(ncclCommAbort(comm));
}

#define CHECK_CUDA(call)                                                                     \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "rank %d FATAL %s: %s\n", g_rank, #call, cudaGetErrorString(e_)); \
      std::exit(102);                                                                        \
    }                                                                                        \
  } while (0)

// Device memory on a stream: what a GPU program does. Every rank on device 0 (NCCL refuses two
// ranks on one GPU; railyard does not).
void Device() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("rank %d: device part skipped: no CUDA device\n", g_rank);
    ++g_failures;  // asked for on a machine without a GPU: say so in the exit code
    return;
  }
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  ncclComm_t comm = Init("device", g_nranks, g_rank);
  const size_t count = (size_t{1} << 20) + 5;
  const int n = g_nranks;
  for (bool memalloc : {false, true}) {
    for (ncclDataType_t t : {ncclFloat32, ncclBfloat16, ncclInt32, ncclFloat64}) {
      const size_t e = railyard::nccl::ElementBytes(t);
      for (ncclRedOp_t op : {ncclSum, ncclMax}) {
        std::vector<char> host(count * e * n), back(count * e * n);
        for (size_t i = 0; i < count; ++i) Set(host.data(), i, t, Input(g_rank, i, op));
        void *send = nullptr, *recv = nullptr;
        if (memalloc) {
          CHECK_NCCL(ncclMemAlloc(&send, count * e * n));
          CHECK_NCCL(ncclMemAlloc(&recv, count * e * n));
        } else {
          CHECK_CUDA(cudaMalloc(&send, count * e * n));
          CHECK_CUDA(cudaMalloc(&recv, count * e * n));
        }
        CHECK_CUDA(cudaMemcpyAsync(send, host.data(), count * e, cudaMemcpyHostToDevice, stream));
        CHECK_NCCL(ncclAllReduce(send, recv, count, t, op, comm, stream));
        CHECK_CUDA(cudaMemcpyAsync(back.data(), recv, count * e, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i)
          bad += !Close(Get(back.data(), i, t), Reduce(i, op, t), t);
        EXPECT(bad == 0, "device AllReduce type %d op %d memalloc %d: %zu wrong", t, op, memalloc,
               bad);
        // AllGather in place, then a send/recv ring in a group, on the same stream.
        CHECK_CUDA(cudaMemcpyAsync(static_cast<char*>(recv) + g_rank * count * e, host.data(),
                                   count * e, cudaMemcpyHostToDevice, stream));
        CHECK_NCCL(ncclAllGather(static_cast<char*>(recv) + g_rank * count * e, recv, count, t,
                                 comm, stream));
        CHECK_CUDA(
            cudaMemcpyAsync(back.data(), recv, count * e * n, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        bad = 0;
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < count; i += 97)
            bad += Get(back.data(), q * count + i, t) != Input(q, i, op);
        }
        EXPECT(bad == 0, "device AllGather type %d memalloc %d: %zu wrong", t, memalloc, bad);
        CHECK_NCCL(ncclGroupStart());
        CHECK_NCCL(ncclSend(send, count, t, (g_rank + 1) % n, comm, stream));
        CHECK_NCCL(ncclRecv(recv, count, t, (g_rank + n - 1) % n, comm, stream));
        CHECK_NCCL(ncclGroupEnd());
        CHECK_CUDA(cudaMemcpyAsync(back.data(), recv, count * e, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        bad = 0;
        for (size_t i = 0; i < count; i += 97) {
          bad += Get(back.data(), i, t) != Input((g_rank + n - 1) % n, i, op);
        }
        EXPECT(bad == 0, "device send/recv ring type %d memalloc %d: %zu wrong", t, memalloc, bad);
        if (memalloc) {
          CHECK_NCCL(ncclMemFree(send));
          CHECK_NCCL(ncclMemFree(recv));
        } else {
          CHECK_CUDA(cudaFree(send));
          CHECK_CUDA(cudaFree(recv));
        }
      }
    }
  }
  ncclResult_t async = ncclInternalError;
  CHECK_NCCL(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "device async error %d", async);
  CHECK_NCCL(ncclCommDestroy(comm));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

bool Wants(const std::string& parts, const char* part) {
  return parts.empty() ||
         ("," + parts + ",").find(std::string(",") + part + ",") != std::string::npos;
}

}  // namespace

int main() {
  g_rank = std::atoi(std::getenv("NCCL_TEST_RANK") ? std::getenv("NCCL_TEST_RANK") : "0");
  g_nranks = std::atoi(std::getenv("NCCL_TEST_NRANKS") ? std::getenv("NCCL_TEST_NRANKS") : "1");
  g_dir = std::getenv("NCCL_TEST_DIR") ? std::getenv("NCCL_TEST_DIR") : ".";
  const std::string parts = std::getenv("NCCL_TEST_PARTS") ? std::getenv("NCCL_TEST_PARTS") : "";
  ncclComm_t comm = Init("world", g_nranks, g_rank);
  const struct {
    const char* name;
    std::function<void()> run;
  } steps[] = {
      {"matrix", [&] { Matrix(comm); }},
      {"group", [&] { Group(comm); }},
      {"p2p", [&] { P2p(comm); }},
      {"split", [&] { Split(comm); }},
      {"shrink", [&] { Shrink(comm); }},
      {"nonblocking", [] { NonBlocking(); }},
      {"premulsum", [&] { PreMulSum(comm); }},
      {"errors", [&] { Errors(comm); }},
      {"initall", [] { InitAll(); }},
      {"abort", [] { Abort(); }},
      {"device", [] { Device(); }},
  };
  for (const auto& step : steps) {
    if (!Wants(parts, step.name)) continue;
    if (parts.empty() && std::strcmp(step.name, "device") == 0) continue;  // only when asked
    const int before_cases = g_cases, before_failures = g_failures;
    const auto t0 = std::chrono::steady_clock::now();
    step.run();
    std::printf("rank %d: %s %d cases, %d failed, %.2f s\n", g_rank, step.name,
                g_cases - before_cases, g_failures - before_failures,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  }
  CHECK_NCCL(ncclCommDestroy(comm));
  std::printf("rank %d: %d cases, %d failed\n", g_rank, g_cases, g_failures);
  return std::min(g_failures, 99);
}
