#include "tools/perf/data_check.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace railyard::perf {
namespace {

bool IsUnsigned(DataType dtype) {
  return dtype == DataType::kUint8 || dtype == DataType::kUint32 || dtype == DataType::kUint64;
}

// Floating types: storage, accumulation type (daemon/kernels/reduce.h) and check tolerance.
struct Float32Storage {
  using Stored = float;
  using Acc = float;
  static Stored Store(Acc v) { return v; }
  static double Load(Stored v) { return v; }
  static constexpr double kTolerance = 1e-6;
};
struct Float64Storage {
  using Stored = double;
  using Acc = double;
  static Stored Store(Acc v) { return v; }
  static double Load(Stored v) { return v; }
  static constexpr double kTolerance = 1e-12;
};
struct HalfStorage {
  using Stored = uint16_t;
  using Acc = float;
  static Stored Store(Acc v) { return ReferenceFloatToHalf(v); }
  static double Load(Stored v) { return ReferenceHalfToFloat(v); }
  static constexpr double kTolerance = 2e-3;  // ~2 ulp (10-bit mantissa)
};
struct BFloat16Storage {
  using Stored = uint16_t;
  using Acc = float;
  static Stored Store(Acc v) { return ReferenceFloatToBFloat16(v); }
  static double Load(Stored v) { return ReferenceBFloat16ToFloat(v); }
  static constexpr double kTolerance = 1.6e-2;  // ~2 ulp (7-bit mantissa)
};

template <typename T>
void FillIntInput(const PatternParams& p, int rank, size_t first, size_t count, void* dst) {
  T* out = static_cast<T*>(dst);
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<T>(PatternValue(p, rank, first + i));
}

template <typename S>
void FillFloatInput(const PatternParams& p, int rank, size_t first, size_t count, void* dst) {
  auto* out = static_cast<typename S::Stored*>(dst);
  for (size_t i = 0; i < count; ++i) {
    out[i] = S::Store(static_cast<typename S::Acc>(PatternValue(p, rank, first + i)));
  }
}

// Integers: the kernels wrap modulo 2^bits, which is what uint64_t arithmetic truncated to T does.
template <typename T>
void FillIntReduced(const PatternParams& p, size_t first, size_t count, void* dst) {
  T* out = static_cast<T*>(dst);
  for (size_t i = 0; i < count; ++i) {
    const size_t index = first + i;
    uint64_t acc = static_cast<uint64_t>(PatternValue(p, 0, index));
    T extreme = static_cast<T>(PatternValue(p, 0, index));
    for (int r = 1; r < p.nranks; ++r) {
      const int64_t v = PatternValue(p, r, index);
      switch (p.op) {
        case RedOp::kSum:
        case RedOp::kAvg:
          acc += static_cast<uint64_t>(v);
          break;
        case RedOp::kProd:
          acc *= static_cast<uint64_t>(v);
          break;
        case RedOp::kMin:
          extreme = std::min(extreme, static_cast<T>(v));
          break;
        case RedOp::kMax:
          extreme = std::max(extreme, static_cast<T>(v));
          break;
      }
    }
    switch (p.op) {
      case RedOp::kSum:
      case RedOp::kProd:
        out[i] = static_cast<T>(acc);
        break;
      case RedOp::kAvg: {
        const T sum = static_cast<T>(acc);  // the kernels divide the wrapped sum
        if constexpr (std::is_signed_v<T>) {
          out[i] = static_cast<T>(static_cast<int64_t>(sum) / p.nranks);  // toward zero
        } else {
          out[i] = static_cast<T>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(p.nranks));
        }
        break;
      }
      case RedOp::kMin:
      case RedOp::kMax:
        out[i] = extreme;
        break;
    }
  }
}

template <typename S>
void FillFloatReduced(const PatternParams& p, size_t first, size_t count, void* dst) {
  using Acc = typename S::Acc;
  auto* out = static_cast<typename S::Stored*>(dst);
  for (size_t i = 0; i < count; ++i) {
    const size_t index = first + i;
    Acc acc = static_cast<Acc>(PatternValue(p, 0, index));
    for (int r = 1; r < p.nranks; ++r) {
      const Acc v = static_cast<Acc>(PatternValue(p, r, index));
      switch (p.op) {
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
    if (p.op == RedOp::kAvg) acc /= static_cast<Acc>(p.nranks);
    out[i] = S::Store(acc);
  }
}

template <typename T>
size_t CountIntWrong(const void* got, const void* expected, size_t count) {
  const T* g = static_cast<const T*>(got);
  const T* e = static_cast<const T*>(expected);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += g[i] != e[i];
  return wrong;
}

template <typename S>
size_t CountFloatWrong(const void* got, const void* expected, size_t count) {
  const auto* g = static_cast<const typename S::Stored*>(got);
  const auto* e = static_cast<const typename S::Stored*>(expected);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const double gv = S::Load(g[i]);
    const double ev = S::Load(e[i]);
    const double tolerance = S::kTolerance * std::max(1.0, std::fabs(ev));
    wrong += !(std::fabs(gv - ev) <= tolerance);  // NaN counts as wrong
  }
  return wrong;
}

}  // namespace

int64_t PatternValue(const PatternParams& p, int rank, size_t index) {
  const uint64_t i = index;
  const uint64_t r = static_cast<uint64_t>(rank);
  const bool is_unsigned = IsUnsigned(p.dtype);
  if (p.op == RedOp::kProd) {
    int64_t magnitude = (i + p.seed) % static_cast<uint64_t>(p.nranks) == r ? 2 : 1;
    if (!is_unsigned && (i * 5 + r * 3 + p.seed) % 7 == 0) magnitude = -magnitude;
    return magnitude;
  }
  uint64_t range = 11;
  int64_t shift = 5;
  if (p.op == RedOp::kAvg && kernels::ElementSize(p.dtype) == 1) {
    range = 3;
    shift = 1;
  }
  const int64_t v = static_cast<int64_t>((i * 3 + r * 5 + p.seed * 7) % range);
  return is_unsigned ? v : v - shift;
}

void FillInput(const PatternParams& p, int rank, size_t first, size_t count, void* dst) {
  switch (p.dtype) {
    case DataType::kFloat32:
      return FillFloatInput<Float32Storage>(p, rank, first, count, dst);
    case DataType::kFloat64:
      return FillFloatInput<Float64Storage>(p, rank, first, count, dst);
    case DataType::kFloat16:
      return FillFloatInput<HalfStorage>(p, rank, first, count, dst);
    case DataType::kBFloat16:
      return FillFloatInput<BFloat16Storage>(p, rank, first, count, dst);
    case DataType::kInt8:
      return FillIntInput<int8_t>(p, rank, first, count, dst);
    case DataType::kUint8:
      return FillIntInput<uint8_t>(p, rank, first, count, dst);
    case DataType::kInt32:
      return FillIntInput<int32_t>(p, rank, first, count, dst);
    case DataType::kUint32:
      return FillIntInput<uint32_t>(p, rank, first, count, dst);
    case DataType::kInt64:
      return FillIntInput<int64_t>(p, rank, first, count, dst);
    case DataType::kUint64:
      return FillIntInput<uint64_t>(p, rank, first, count, dst);
  }
}

void FillReduced(const PatternParams& p, size_t first, size_t count, void* dst) {
  switch (p.dtype) {
    case DataType::kFloat32:
      return FillFloatReduced<Float32Storage>(p, first, count, dst);
    case DataType::kFloat64:
      return FillFloatReduced<Float64Storage>(p, first, count, dst);
    case DataType::kFloat16:
      return FillFloatReduced<HalfStorage>(p, first, count, dst);
    case DataType::kBFloat16:
      return FillFloatReduced<BFloat16Storage>(p, first, count, dst);
    case DataType::kInt8:
      return FillIntReduced<int8_t>(p, first, count, dst);
    case DataType::kUint8:
      return FillIntReduced<uint8_t>(p, first, count, dst);
    case DataType::kInt32:
      return FillIntReduced<int32_t>(p, first, count, dst);
    case DataType::kUint32:
      return FillIntReduced<uint32_t>(p, first, count, dst);
    case DataType::kInt64:
      return FillIntReduced<int64_t>(p, first, count, dst);
    case DataType::kUint64:
      return FillIntReduced<uint64_t>(p, first, count, dst);
  }
}

void FillSentinel(DataType dtype, size_t count, void* dst) {
  // 0xA5 bytes: a large negative or odd value in every type, far from the small test values.
  std::memset(dst, 0xA5, count * kernels::ElementSize(dtype));
}

size_t CountWrong(DataType dtype, const void* got, const void* expected, size_t count) {
  switch (dtype) {
    case DataType::kFloat32:
      return CountFloatWrong<Float32Storage>(got, expected, count);
    case DataType::kFloat64:
      return CountFloatWrong<Float64Storage>(got, expected, count);
    case DataType::kFloat16:
      return CountFloatWrong<HalfStorage>(got, expected, count);
    case DataType::kBFloat16:
      return CountFloatWrong<BFloat16Storage>(got, expected, count);
    case DataType::kInt8:
    case DataType::kUint8:
      return CountIntWrong<uint8_t>(got, expected, count);
    case DataType::kInt32:
    case DataType::kUint32:
      return CountIntWrong<uint32_t>(got, expected, count);
    case DataType::kInt64:
    case DataType::kUint64:
      return CountIntWrong<uint64_t>(got, expected, count);
  }
  return count;
}

std::vector<ExpectedRegion> ExpectedRegions(PerfOp op, const OpLayout& layout, int rank, int nranks,
                                            int root, bool in_place) {
  const Slot recv = RecvSlot(op, layout, rank, in_place);
  const size_t count = layout.count;
  const size_t r = static_cast<size_t>(rank);
  std::vector<ExpectedRegion> regions;
  switch (op) {
    case PerfOp::kAllReduce:
      regions.push_back({recv.offset, count, ExpectedRegion::kReduced, 0});
      break;
    case PerfOp::kReduce:
      if (rank == root) regions.push_back({recv.offset, count, ExpectedRegion::kReduced, 0});
      break;
    case PerfOp::kReduceScatter:
      regions.push_back({recv.offset, count, ExpectedRegion::kReduced, r * count});
      break;
    case PerfOp::kBroadcast:
      regions.push_back({recv.offset, count, root, 0});
      break;
    case PerfOp::kAllGather:
      for (int j = 0; j < nranks; ++j) {
        regions.push_back({recv.offset + static_cast<size_t>(j) * count, count, j, 0});
      }
      break;
    case PerfOp::kAllToAll:
      for (int j = 0; j < nranks; ++j) {
        regions.push_back({recv.offset + static_cast<size_t>(j) * count, count, j, r * count});
      }
      break;
    case PerfOp::kAllToAllv:
      for (int j = 0; j < nranks; ++j) {
        regions.push_back({recv.offset + static_cast<size_t>(j) * count,
                           AllToAllvCount(count, j, rank), j, r * count});
      }
      break;
    case PerfOp::kSendRecv:
      regions.push_back({recv.offset, count, RecvPeer(rank, nranks), 0});
      break;
    case PerfOp::kBarrier:
      break;
  }
  return regions;
}

uint16_t ReferenceFloatToHalf(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to infinity
  if (abs < 0x38800000u) {                        // below 2^-14: subnormal (units of 2^-24)
    const double units = std::nearbyint(static_cast<double>(std::bit_cast<float>(abs)) * 0x1p24);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));
  }
  const uint32_t exponent = (abs >> 23) - 127 + 15;
  const uint32_t mantissa = abs & 0x7FFFFFu;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent
  return static_cast<uint16_t>(sign | half);
}

float ReferenceHalfToFloat(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else {
    magnitude = std::ldexp(static_cast<double>(mantissa + 1024), exponent - 25);
  }
  return static_cast<float>((bits & 0x8000u) ? -magnitude : magnitude);
}

uint16_t ReferenceFloatToBFloat16(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float ReferenceBFloat16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

}  // namespace railyard::perf
