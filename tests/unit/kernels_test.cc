// Tests for the CPU reduction kernels (daemon/kernels/reduce.h, types.h).
//
// The reference implementation below is written independently of daemon/kernels: float16 goes
// through GCC's _Float16 (libgcc conversions), bfloat16 rounding picks the nearer of the two
// neighbouring bfloat16 values in double, integers are reduced in uint64_t arithmetic and
// truncated at the end. Results are compared bit for bit (any NaN matches any NaN).
//
// Documented special-value behaviour (see reduce.h), checked in the *Special* tests:
//  - sum/prod/avg follow IEEE arithmetic in the accumulate type: NaN + x = NaN, inf + -inf = NaN,
//    0 * inf = NaN, inf * -2 = -inf; a float16/bfloat16 sum that exceeds the format's range is
//    stored as +-inf, but an intermediate float32 sum may exceed it as long as the final one fits.
//  - min/max propagate NaN: if any source element is NaN (first, middle or last source) the
//    result is NaN; +-inf are ordinary values (min(inf, 3) = 3).
//  - integer sum/prod wrap modulo 2^bits; integer avg is C++ truncating division of the wrapped
//    signed (or unsigned) sum.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "daemon/kernels/reduce.h"
#include "daemon/kernels/types.h"

namespace railyard::kernels {
namespace {

constexpr DataType kAllTypes[] = {
    DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
    DataType::kInt8,    DataType::kUint8,   DataType::kInt32,   DataType::kUint32,
    DataType::kInt64,   DataType::kUint64,
};
constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax, RedOp::kAvg};

// ---------------------------------------------------------------------------------------------
// Independent reference conversions.

uint16_t RefFloatToHalf(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }
float RefHalfToFloat(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }

float RefBf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// Round to nearest, ties to even, by comparing distances to the two neighbouring bfloat16 values
// in double (exact: both neighbours and f are floats). The neighbour above the largest finite
// value is inf, which IEEE rounds to as if it were 2^128.
uint16_t RefFloatToBf16(float f) {
  if (std::isnan(f)) return 0x7FC0;  // compared with IsNanBf16 only
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncated towards zero
  if ((u & 0xFFFF) == 0) return lo;
  const uint16_t hi = static_cast<uint16_t>(lo + 1);  // next away from zero (may be inf)
  const double a = std::fabs(static_cast<double>(f));
  const double lo_v = std::fabs(static_cast<double>(RefBf16ToFloat(lo)));
  const double hi_v = (hi & 0x7FFF) == 0x7F80 ? std::ldexp(1.0, 128)
                                              : std::fabs(static_cast<double>(RefBf16ToFloat(hi)));
  const double dlo = a - lo_v;
  const double dhi = hi_v - a;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

bool IsNanHalf(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0; }
bool IsNanBf16(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0; }

// ---------------------------------------------------------------------------------------------
// Per-dtype test traits: storage type, random values, reference reduction, equality.

struct Half {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

template <typename T>
struct TT;

template <typename F>
struct FloatTTBase {
  using Storage = F;
  using Acc = F;
  static Acc ToAcc(Storage x) { return x; }
  static Storage FromAcc(Acc a) { return a; }
  static bool IsNan(Storage x) { return std::isnan(x); }
  static uint64_t Bits(Storage x) {
    if constexpr (sizeof(F) == 4) {
      return std::bit_cast<uint32_t>(x);
    } else {
      return std::bit_cast<uint64_t>(x);
    }
  }
  // Values in +-[0.25, 2) with random low bits, so sums round and 7-way products stay finite.
  static Storage Random(std::mt19937_64& rng) {
    std::uniform_real_distribution<F> mag(0.25, 2.0);
    const F v = mag(rng);
    return (rng() & 1) ? -v : v;
  }
};
template <>
struct TT<float> : FloatTTBase<float> {};
template <>
struct TT<double> : FloatTTBase<double> {};

template <>
struct TT<Half> {
  using Storage = uint16_t;
  using Acc = float;
  static Acc ToAcc(Storage x) { return RefHalfToFloat(x); }
  static Storage FromAcc(Acc a) { return RefFloatToHalf(a); }
  static bool IsNan(Storage x) { return IsNanHalf(x); }
  static uint64_t Bits(Storage x) { return x; }
  static Storage Random(std::mt19937_64& rng) {
    std::uniform_real_distribution<float> mag(0.25f, 2.0f);
    const float v = mag(rng);
    return RefFloatToHalf((rng() & 1) ? -v : v);
  }
};

template <>
struct TT<BF16> {
  using Storage = uint16_t;
  using Acc = float;
  static Acc ToAcc(Storage x) { return RefBf16ToFloat(x); }
  static Storage FromAcc(Acc a) { return RefFloatToBf16(a); }
  static bool IsNan(Storage x) { return IsNanBf16(x); }
  static uint64_t Bits(Storage x) { return x; }
  static Storage Random(std::mt19937_64& rng) {
    std::uniform_real_distribution<float> mag(0.25f, 2.0f);
    const float v = mag(rng);
    return RefFloatToBf16((rng() & 1) ? -v : v);
  }
};

template <typename T>
requires std::is_integral_v<T>
struct TT<T> {
  using Storage = T;
  static bool IsNan(Storage) { return false; }
  static uint64_t Bits(Storage x) { return static_cast<uint64_t>(x); }
  // Full-range random bits, so sums and products wrap.
  static Storage Random(std::mt19937_64& rng) { return static_cast<T>(rng()); }
};

template <typename T>
constexpr bool kIsFloatTT = !std::is_integral_v<T>;

// Reference: one element, sources combined left to right.
template <typename T>
typename TT<T>::Storage RefElement(RedOp op,
                                   const std::vector<const typename TT<T>::Storage*>& srcs,
                                   size_t i, uint32_t div) {
  using S = typename TT<T>::Storage;
  if constexpr (kIsFloatTT<T>) {
    using A = typename TT<T>::Acc;
    A acc = TT<T>::ToAcc(srcs[0][i]);
    for (size_t s = 1; s < srcs.size(); ++s) {
      const A b = TT<T>::ToAcc(srcs[s][i]);
      switch (op) {
        case RedOp::kSum:
        case RedOp::kAvg:
          acc = acc + b;
          break;
        case RedOp::kProd:
          acc = acc * b;
          break;
        case RedOp::kMin:
          acc = (std::isnan(acc) || std::isnan(b)) ? std::numeric_limits<A>::quiet_NaN()
                                                   : (b < acc ? b : acc);
          break;
        case RedOp::kMax:
          acc = (std::isnan(acc) || std::isnan(b)) ? std::numeric_limits<A>::quiet_NaN()
                                                   : (b > acc ? b : acc);
          break;
      }
    }
    if (op == RedOp::kAvg) acc = acc / static_cast<A>(div);
    return TT<T>::FromAcc(acc);
  } else {
    // Integers: modular arithmetic in uint64_t, truncated to the type at the end.
    if (op == RedOp::kMin || op == RedOp::kMax) {
      S acc = srcs[0][i];
      for (size_t s = 1; s < srcs.size(); ++s) {
        const S b = srcs[s][i];
        acc = op == RedOp::kMin ? std::min(acc, b) : std::max(acc, b);
      }
      return acc;
    }
    uint64_t acc = static_cast<uint64_t>(srcs[0][i]);
    for (size_t s = 1; s < srcs.size(); ++s) {
      const uint64_t b = static_cast<uint64_t>(srcs[s][i]);
      acc = op == RedOp::kProd ? acc * b : acc + b;
    }
    const S wrapped = static_cast<S>(acc);
    if (op != RedOp::kAvg) return wrapped;
    if constexpr (std::is_signed_v<S>) {
      return static_cast<S>(static_cast<int64_t>(wrapped) / static_cast<int64_t>(div));
    } else {
      return static_cast<S>(static_cast<uint64_t>(wrapped) / div);
    }
  }
}

template <typename T>
bool SameValue(typename TT<T>::Storage a, typename TT<T>::Storage b) {
  if (TT<T>::IsNan(a) || TT<T>::IsNan(b)) return TT<T>::IsNan(a) && TT<T>::IsNan(b);
  return TT<T>::Bits(a) == TT<T>::Bits(b);
}

// Where the destination of a Reduce() call lives.
enum class Alias { kNone, kFirstSrc, kLastSrc };

template <typename T>
void CheckReduce(DataType dtype, RedOp op, int nsrcs, size_t count, Alias alias, uint32_t div,
                 uint64_t seed) {
  using S = typename TT<T>::Storage;
  SCOPED_TRACE(::testing::Message()
               << "dtype=" << Name(dtype) << " op=" << Name(op) << " nsrcs=" << nsrcs
               << " count=" << count << " alias=" << static_cast<int>(alias) << " div=" << div);
  std::mt19937_64 rng(seed);
  std::vector<std::vector<S>> data(nsrcs, std::vector<S>(count));
  for (auto& v : data) {
    for (auto& x : v) x = TT<T>::Random(rng);
  }
  // Reference from untouched copies.
  std::vector<const S*> ref_srcs;
  for (const auto& v : data) ref_srcs.push_back(v.data());
  std::vector<S> expected(count);
  for (size_t i = 0; i < count; ++i) expected[i] = RefElement<T>(op, ref_srcs, i, div);

  std::vector<std::vector<S>> work = data;
  std::vector<const void*> srcs;
  for (const auto& v : work) srcs.push_back(v.data());
  std::vector<S> out(count, S{});
  void* dst = out.data();
  if (alias == Alias::kFirstSrc) dst = work.front().data();
  if (alias == Alias::kLastSrc) dst = work.back().data();
  Reduce(dtype, op, dst, srcs.data(), nsrcs, count, div);

  const S* got = static_cast<const S*>(dst);
  size_t mismatches = 0;
  for (size_t i = 0; i < count && mismatches < 5; ++i) {
    if (!SameValue<T>(got[i], expected[i])) {
      ++mismatches;
      ADD_FAILURE() << "element " << i << ": got bits 0x" << std::hex << TT<T>::Bits(got[i])
                    << ", want 0x" << TT<T>::Bits(expected[i]);
    }
  }
  // Sources that are not the destination are untouched.
  for (int s = 0; s < nsrcs; ++s) {
    if (work[s].data() == dst) continue;
    EXPECT_EQ(0, count == 0 ? 0 : std::memcmp(work[s].data(), data[s].data(), count * sizeof(S)))
        << "source " << s << " was modified";
  }
}

template <typename T>
void CheckReduceToMany(DataType dtype, RedOp op, uint64_t seed) {
  using S = typename TT<T>::Storage;
  constexpr int kSrcs = 3;
  constexpr size_t kCount = 4099;
  for (int layout = 0; layout < 2; ++layout) {
    SCOPED_TRACE(::testing::Message()
                 << "dtype=" << Name(dtype) << " op=" << Name(op) << " layout=" << layout);
    std::mt19937_64 rng(seed + layout);
    std::vector<std::vector<S>> data(kSrcs, std::vector<S>(kCount));
    for (auto& v : data) {
      for (auto& x : v) x = TT<T>::Random(rng);
    }
    std::vector<const S*> ref_srcs;
    for (const auto& v : data) ref_srcs.push_back(v.data());
    std::vector<S> expected(kCount);
    for (size_t i = 0; i < kCount; ++i) expected[i] = RefElement<T>(op, ref_srcs, i, kSrcs);

    std::vector<std::vector<S>> work = data;
    std::vector<const void*> srcs;
    for (const auto& v : work) srcs.push_back(v.data());
    std::vector<S> fresh1(kCount), fresh2(kCount);
    // Layout 0: the middle dst aliases srcs[1]. Layout 1: dsts[0] aliases srcs[0] and dsts[2]
    // aliases srcs[2].
    void* dsts[3];
    if (layout == 0) {
      dsts[0] = fresh1.data();
      dsts[1] = work[1].data();
      dsts[2] = fresh2.data();
    } else {
      dsts[0] = work[0].data();
      dsts[1] = fresh1.data();
      dsts[2] = work[2].data();
    }
    ReduceToMany(dtype, op, dsts, 3, srcs.data(), kSrcs, kCount, kSrcs);
    for (void* d : dsts) {
      const S* got = static_cast<const S*>(d);
      size_t mismatches = 0;
      for (size_t i = 0; i < kCount && mismatches < 5; ++i) {
        if (!SameValue<T>(got[i], expected[i])) {
          ++mismatches;
          ADD_FAILURE() << "dst " << d << " element " << i;
        }
      }
    }
  }
}

template <typename Fn>
void WithType(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat32:
      return fn.template operator()<float>();
    case DataType::kFloat64:
      return fn.template operator()<double>();
    case DataType::kFloat16:
      return fn.template operator()<Half>();
    case DataType::kBFloat16:
      return fn.template operator()<BF16>();
    case DataType::kInt8:
      return fn.template operator()<int8_t>();
    case DataType::kUint8:
      return fn.template operator()<uint8_t>();
    case DataType::kInt32:
      return fn.template operator()<int32_t>();
    case DataType::kUint32:
      return fn.template operator()<uint32_t>();
    case DataType::kInt64:
      return fn.template operator()<int64_t>();
    case DataType::kUint64:
      return fn.template operator()<uint64_t>();
  }
  FAIL() << "bad dtype";
}

// ---------------------------------------------------------------------------------------------
// Every dtype x every op x nsrcs x count x aliasing, against the reference.

class ReduceSweepTest : public ::testing::TestWithParam<std::tuple<DataType, RedOp>> {};

TEST_P(ReduceSweepTest, MatchesReference) {
  const auto [dtype, op] = GetParam();
  uint64_t seed = 1234 + static_cast<uint64_t>(dtype) * 100 + static_cast<uint64_t>(op);
  WithType(dtype, [&]<typename T>() {
    for (int nsrcs : {1, 2, 3, 4, 7}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{4099}}) {
        for (Alias alias : {Alias::kNone, Alias::kFirstSrc, Alias::kLastSrc}) {
          // Avg divides by the number of sources (the AllReduce case).
          CheckReduce<T>(dtype, op, nsrcs, count, alias, static_cast<uint32_t>(nsrcs), ++seed);
        }
      }
    }
    // Avg with a divisor that differs from nsrcs (including the nsrcs == 1 division path).
    if (op == RedOp::kAvg) {
      CheckReduce<T>(dtype, op, 1, 1000, Alias::kNone, 3, ++seed);
      CheckReduce<T>(dtype, op, 1, 1000, Alias::kFirstSrc, 5, ++seed);
      CheckReduce<T>(dtype, op, 4, 1000, Alias::kNone, 7, ++seed);
    }
  });
}

TEST_P(ReduceSweepTest, ReduceToManyWithAliasing) {
  const auto [dtype, op] = GetParam();
  WithType(dtype, [&]<typename T>() {
    CheckReduceToMany<T>(dtype, op, 99 + static_cast<uint64_t>(dtype));
  });
}

INSTANTIATE_TEST_SUITE_P(AllTypesAllOps, ReduceSweepTest,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kAllOps)),
                         [](const ::testing::TestParamInfo<ReduceSweepTest::ParamType>& info) {
                           return std::string(Name(std::get<0>(info.param))) + "_" +
                                  std::string(Name(std::get<1>(info.param)));
                         });

// A count of zero touches nothing: with null pointers it must not crash, and with real buffers
// every byte of them stays as it was.
TEST(ReduceTest, CountZeroIsANoOpEvenWithNullPointers) {
  for (DataType dtype : kAllTypes) {
    for (RedOp op : kAllOps) {
      Reduce(dtype, op, nullptr, nullptr, 3, 0, 3);
      ReduceToMany(dtype, op, nullptr, 2, nullptr, 3, 0, 3);
    }
  }
  Copy(nullptr, nullptr, 0);
  Swap(nullptr, nullptr, 0);

  std::vector<uint8_t> dst(64, 0xA5), dst2(64, 0x3C), src1(64, 0x11), src2(64, 0x22);
  const std::vector<uint8_t> dst_before = dst, dst2_before = dst2, src1_before = src1,
                             src2_before = src2;
  for (DataType dtype : kAllTypes) {
    for (RedOp op : kAllOps) {
      const void* srcs[] = {src1.data(), src2.data()};
      Reduce(dtype, op, dst.data(), srcs, 2, 0, 2);
      void* dsts[] = {dst.data(), dst2.data()};
      ReduceToMany(dtype, op, dsts, 2, srcs, 2, 0, 2);
    }
  }
  Copy(dst.data(), src1.data(), 0);
  Swap(dst.data(), dst2.data(), 0);
  EXPECT_EQ(dst, dst_before);
  EXPECT_EQ(dst2, dst2_before);
  EXPECT_EQ(src1, src1_before);
  EXPECT_EQ(src2, src2_before);
}

TEST(ReduceTest, SingleSourceToManyDsts) {
  std::vector<float> src = {1.5f, -2.0f, 3.25f};
  std::vector<float> a(3), b(3);
  const void* srcs[] = {src.data()};
  void* dsts[] = {a.data(), src.data(), b.data()};
  ReduceToMany(DataType::kFloat32, RedOp::kSum, dsts, 3, srcs, 1, 3, 1);
  EXPECT_EQ(a, src);
  EXPECT_EQ(b, src);
  EXPECT_EQ(src, (std::vector<float>{1.5f, -2.0f, 3.25f}));
}

// ---------------------------------------------------------------------------------------------
// float16 / bfloat16 conversions.

TEST(HalfTest, RoundingCases) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  // Halfway cases round to even.
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3C00);             // 1 + half ulp -> 1
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3C02);         // 1 + 1.5 ulp -> 1 + 2^-9
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // just above halfway
  EXPECT_EQ(FloatToHalf(-(1.0f + 3 * 0x1p-11f)), 0xBC02);
  // Max finite, overflow to infinity.
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);  // below the halfway point to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // halfway: ties to even = inf
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-1e6f), 0xFC00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xFC00);
  // Normals / subnormals.
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);             // smallest normal
  EXPECT_EQ(FloatToHalf(0x1p-14f - 0x1p-24f), 0x03FF);  // largest subnormal
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_EQ(FloatToHalf(-0x1p-24f), 0x8001);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);               // halfway to 0: even
  EXPECT_EQ(FloatToHalf(0x1p-25f * 1.0000001f), 0x0001);  // just above halfway
  EXPECT_EQ(FloatToHalf(3 * 0x1p-25f), 0x0002);           // 1.5 ulp: even
  EXPECT_EQ(FloatToHalf(0x1p-30f), 0x0000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  // NaN stays NaN (quiet), sign kept.
  EXPECT_TRUE(IsNanHalf(FloatToHalf(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(IsNanHalf(FloatToHalf(std::bit_cast<float>(0x7F800001u))));  // signalling, low bit
  EXPECT_TRUE(FloatToHalf(std::bit_cast<float>(0x7F800001u)) & 0x0200);    // quiet bit set
  EXPECT_EQ(FloatToHalf(std::bit_cast<float>(0xFFC00000u)) & 0x8000, 0x8000);

  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x03FF), 0x1p-14f - 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7C01)));  // signalling NaN
}

TEST(HalfTest, HalfToFloatExhaustive) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    const float want = RefHalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << std::hex << h;
      // Round trip.
      ASSERT_EQ(FloatToHalf(got), h) << std::hex << h;
    }
  }
}

TEST(HalfTest, FloatToHalfMatchesReference) {
  // Returns false (after one failure message) on a mismatch.
  auto check = [](uint32_t u) {
    const float f = std::bit_cast<float>(u);
    const uint16_t got = FloatToHalf(f);
    const bool ok = std::isnan(f) ? IsNanHalf(got) : got == RefFloatToHalf(f);
    if (!ok) {
      ADD_FAILURE() << "float bits 0x" << std::hex << u << ": got 0x" << got << ", want 0x"
                    << RefFloatToHalf(f);
    }
    return ok;
  };
  // A stride through all float bit patterns.
  for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += 4093) {
    if (!check(static_cast<uint32_t>(u))) return;
  }
  // Every midpoint between adjacent float16 values (and one float ulp either side).
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const float lo = RefHalfToFloat(static_cast<uint16_t>(h));
    const float hi = h + 1 == 0x7C00 ? 65536.0f : RefHalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;  // exact in float
    const uint32_t m = std::bit_cast<uint32_t>(mid);
    for (uint32_t sign : {0u, 0x80000000u}) {
      if (!check((m - 1) | sign) || !check(m | sign) || !check((m + 1) | sign)) return;
    }
  }
}

TEST(BFloat16Test, RoundingCases) {
  auto f = [](uint32_t u) { return std::bit_cast<float>(u); };
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(f(0x3F808000u)), 0x3F80);  // halfway, even below
  EXPECT_EQ(FloatToBFloat16(f(0x3F818000u)), 0x3F82);  // halfway, even above
  EXPECT_EQ(FloatToBFloat16(f(0x3F808001u)), 0x3F81);  // just above halfway
  EXPECT_EQ(FloatToBFloat16(f(0x3F807FFFu)), 0x3F80);  // just below halfway
  EXPECT_EQ(FloatToBFloat16(f(0xBF818000u)), 0xBF82);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  // Max finite bfloat16 and overflow.
  EXPECT_EQ(FloatToBFloat16(f(0x7F7F0000u)), 0x7F7F);
  EXPECT_EQ(FloatToBFloat16(f(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(FloatToBFloat16(f(0x7F7F8000u)), 0x7F80);  // halfway, odd below: up to inf
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7F80);
  // Subnormals.
  EXPECT_EQ(FloatToBFloat16(f(0x00010000u)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToBFloat16(f(0x00008000u)), 0x0000);  // halfway to 0: even
  EXPECT_EQ(FloatToBFloat16(f(0x00008001u)), 0x0001);
  EXPECT_EQ(FloatToBFloat16(f(0x00018000u)), 0x0002);
  EXPECT_EQ(FloatToBFloat16(f(0x007F8000u)), 0x0080);  // largest subnormal rounds to min normal
  // NaN stays NaN (a signalling NaN whose payload is only in the low bits must not become inf).
  EXPECT_TRUE(IsNanBf16(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(FloatToBFloat16(f(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(FloatToBFloat16(f(0xFF800001u)), 0xFFC0);
  EXPECT_EQ(FloatToBFloat16(f(0x7FFFFFFFu)), 0x7FFF);

  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0x0001), f(0x00010000u));
  EXPECT_EQ(BFloat16ToFloat(0xFF80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0x7FC0)));
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0x7F81)));  // signalling NaN
}

TEST(BFloat16Test, MatchesReference) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float x = BFloat16ToFloat(static_cast<uint16_t>(b));
    if (IsNanBf16(static_cast<uint16_t>(b))) {
      ASSERT_TRUE(std::isnan(x)) << std::hex << b;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(x), std::bit_cast<uint32_t>(RefBf16ToFloat(b))) << b;
    ASSERT_EQ(FloatToBFloat16(x), b) << std::hex << b;
  }
  for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += 4093) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(u));
    if (std::isnan(x)) {
      ASSERT_TRUE(IsNanBf16(FloatToBFloat16(x))) << std::hex << u;
    } else {
      ASSERT_EQ(FloatToBFloat16(x), RefFloatToBf16(x)) << std::hex << u;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Single rounding: float16/bfloat16 accumulate in float32 and round once.

uint16_t Reduce16(DataType dtype, RedOp op, const std::vector<uint16_t>& vals, uint32_t div = 1) {
  std::vector<std::vector<uint16_t>> bufs;
  for (uint16_t v : vals) bufs.push_back({v});
  std::vector<const void*> srcs;
  for (const auto& b : bufs) srcs.push_back(b.data());
  uint16_t out = 0;
  Reduce(dtype, op, &out, srcs.data(), static_cast<int>(srcs.size()), 1, div);
  return out;
}

TEST(AccumulateTest, HalfSumRoundsOnce) {
  const uint16_t one = RefFloatToHalf(1.0f);
  const uint16_t eps = RefFloatToHalf(0x1p-11f);  // half an ulp of 1.0
  // Pairwise in float16 every step would tie back to 1.0; in float32 the sum is 1 + 3 * 2^-11,
  // which rounds (1.5 ulp, tie to even) to 1 + 2^-9.
  EXPECT_EQ(Reduce16(DataType::kFloat16, RedOp::kSum, {one, eps, eps, eps}), 0x3C02);
  // The intermediate float32 sum may exceed the float16 range as long as the final one fits.
  const uint16_t big = RefFloatToHalf(60000.0f);
  const uint16_t nbig = RefFloatToHalf(-60000.0f);
  const uint16_t ten_k = RefFloatToHalf(10000.0f);
  EXPECT_EQ(Reduce16(DataType::kFloat16, RedOp::kSum, {big, big, nbig, ten_k, nbig}),
            RefFloatToHalf(10000.0f));
  // Overflow of the final value goes to infinity.
  EXPECT_EQ(Reduce16(DataType::kFloat16, RedOp::kSum, {0x7BFF, 0x7BFF}), 0x7C00);
  EXPECT_EQ(Reduce16(DataType::kFloat16, RedOp::kSum, {0xFBFF, 0xFBFF}), 0xFC00);
  // Avg divides in float32 before the single rounding: (65504 * 2) / 2 stays finite.
  EXPECT_EQ(Reduce16(DataType::kFloat16, RedOp::kAvg, {0x7BFF, 0x7BFF}, 2), 0x7BFF);
}

TEST(AccumulateTest, BFloat16SumRoundsOnce) {
  const uint16_t one = 0x3F80;
  const uint16_t eps = RefFloatToBf16(0x1p-8f);  // half an ulp of 1.0
  EXPECT_EQ(Reduce16(DataType::kBFloat16, RedOp::kSum, {one, eps, eps, eps}), 0x3F82);
  EXPECT_EQ(Reduce16(DataType::kBFloat16, RedOp::kSum, {one, eps}), 0x3F80);
  EXPECT_EQ(Reduce16(DataType::kBFloat16, RedOp::kSum, {0x7F7F, 0x7F7F}), 0x7F80);
}

TEST(AccumulateTest, Float32AccumulatesInFloat32) {
  // In double 1 + 2^-24 + 2^-24 would be 1 + 2^-23 exactly; in float each add ties back to 1.
  std::vector<float> a = {1.0f}, b = {0x1p-24f}, c = {0x1p-24f};
  const void* srcs[] = {a.data(), b.data(), c.data()};
  float out = 0;
  Reduce(DataType::kFloat32, RedOp::kSum, &out, srcs, 3, 1, 1);
  EXPECT_EQ(out, 1.0f);
  // Order is srcs[0] op srcs[1] op ...: (2^-24 + 2^-24) + 1 = 1 + 2^-23.
  const void* srcs2[] = {b.data(), c.data(), a.data()};
  Reduce(DataType::kFloat32, RedOp::kSum, &out, srcs2, 3, 1, 1);
  EXPECT_EQ(out, 1.0f + 0x1p-23f);
}

// ---------------------------------------------------------------------------------------------
// NaN / inf behaviour (see the file comment).

template <typename F>
F ReduceScalars(DataType dtype, RedOp op, const std::vector<F>& vals) {
  std::vector<const void*> srcs;
  for (const F& v : vals) srcs.push_back(&v);
  F out{};
  Reduce(dtype, op, &out, srcs.data(), static_cast<int>(vals.size()), 1,
         static_cast<uint32_t>(vals.size()));
  return out;
}

template <typename F>
void CheckFloatSpecials(DataType dtype) {
  SCOPED_TRACE(Name(dtype));
  const F inf = std::numeric_limits<F>::infinity();
  const F nan = std::numeric_limits<F>::quiet_NaN();
  EXPECT_EQ(ReduceScalars<F>(dtype, RedOp::kSum, {inf, 1, 2}), inf);
  EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, RedOp::kSum, {inf, 1, -inf})));
  EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, RedOp::kSum, {1, nan, 2})));
  EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, RedOp::kAvg, {1, 2, nan})));
  EXPECT_EQ(ReduceScalars<F>(dtype, RedOp::kProd, {inf, -2}), -inf);
  EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, RedOp::kProd, {0, inf})));
  EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, RedOp::kProd, {nan, 3})));
  EXPECT_EQ(ReduceScalars<F>(dtype, RedOp::kMin, {inf, 3, 5}), 3);
  EXPECT_EQ(ReduceScalars<F>(dtype, RedOp::kMin, {inf, -inf, 5}), -inf);
  EXPECT_EQ(ReduceScalars<F>(dtype, RedOp::kMax, {-inf, 3, inf}), inf);
  for (RedOp op : {RedOp::kMin, RedOp::kMax}) {
    // NaN propagates from any position, for 2, 3 and 4 sources (all code paths).
    EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, op, {nan, 1})));
    EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, op, {1, nan})));
    EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, op, {nan, 1, 2})));
    EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, op, {1, nan, 2})));
    EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, op, {1, 2, nan})));
    EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, op, {-inf, 2, nan, inf})));
    EXPECT_TRUE(std::isnan(ReduceScalars<F>(dtype, op, {nan, nan})));
  }
}

TEST(SpecialValuesTest, Float32) { CheckFloatSpecials<float>(DataType::kFloat32); }
TEST(SpecialValuesTest, Float64) { CheckFloatSpecials<double>(DataType::kFloat64); }

TEST(SpecialValuesTest, HalfAndBFloat16) {
  struct Fmt {
    DataType dtype;
    uint16_t (*from)(float);
    bool (*is_nan)(uint16_t);
  };
  for (const Fmt& fmt : {Fmt{DataType::kFloat16, RefFloatToHalf, IsNanHalf},
                         Fmt{DataType::kBFloat16, RefFloatToBf16, IsNanBf16}}) {
    SCOPED_TRACE(Name(fmt.dtype));
    const uint16_t inf = fmt.from(std::numeric_limits<float>::infinity());
    const uint16_t ninf = fmt.from(-std::numeric_limits<float>::infinity());
    const uint16_t nan = fmt.dtype == DataType::kFloat16 ? 0x7E00 : 0x7FC0;
    const uint16_t one = fmt.from(1.0f), two = fmt.from(2.0f), three = fmt.from(3.0f);
    const uint16_t zero = fmt.from(0.0f), mtwo = fmt.from(-2.0f);
    EXPECT_EQ(Reduce16(fmt.dtype, RedOp::kSum, {inf, one, two}), inf);
    EXPECT_TRUE(fmt.is_nan(Reduce16(fmt.dtype, RedOp::kSum, {inf, one, ninf})));
    EXPECT_TRUE(fmt.is_nan(Reduce16(fmt.dtype, RedOp::kSum, {one, nan})));
    EXPECT_EQ(Reduce16(fmt.dtype, RedOp::kProd, {inf, mtwo}), ninf);
    EXPECT_TRUE(fmt.is_nan(Reduce16(fmt.dtype, RedOp::kProd, {zero, inf})));
    EXPECT_EQ(Reduce16(fmt.dtype, RedOp::kMin, {inf, three, two}), two);
    EXPECT_EQ(Reduce16(fmt.dtype, RedOp::kMax, {ninf, three, inf}), inf);
    // Signalling NaNs (payload only in the low mantissa bits) stay NaN, never become inf.
    const uint16_t snan = fmt.dtype == DataType::kFloat16 ? 0x7C01 : 0x7F81;
    for (RedOp op : kAllOps) {
      EXPECT_TRUE(fmt.is_nan(Reduce16(fmt.dtype, op, {snan, one}))) << Name(op);
      EXPECT_TRUE(fmt.is_nan(Reduce16(fmt.dtype, op, {one, two, snan}))) << Name(op);
    }
    for (RedOp op : {RedOp::kMin, RedOp::kMax}) {
      EXPECT_TRUE(fmt.is_nan(Reduce16(fmt.dtype, op, {nan, one})));
      EXPECT_TRUE(fmt.is_nan(Reduce16(fmt.dtype, op, {one, nan})));
      EXPECT_TRUE(fmt.is_nan(Reduce16(fmt.dtype, op, {one, nan, two})));
      EXPECT_TRUE(fmt.is_nan(Reduce16(fmt.dtype, op, {one, two, three, nan})));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Integer wrap-around and avg.

TEST(IntegerTest, WrapAndAvg) {
  EXPECT_EQ(ReduceScalars<int8_t>(DataType::kInt8, RedOp::kSum, {127, 1}), -128);
  EXPECT_EQ(ReduceScalars<int8_t>(DataType::kInt8, RedOp::kSum, {-128, -1}), 127);
  EXPECT_EQ(ReduceScalars<int8_t>(DataType::kInt8, RedOp::kProd, {-128, -1}), -128);
  EXPECT_EQ(ReduceScalars<int8_t>(DataType::kInt8, RedOp::kProd, {16, 16, 3}), 0);
  EXPECT_EQ(ReduceScalars<uint8_t>(DataType::kUint8, RedOp::kSum, {255, 1}), 0);
  EXPECT_EQ(ReduceScalars<uint8_t>(DataType::kUint8, RedOp::kProd, {200, 2}), 144);
  EXPECT_EQ(ReduceScalars<uint8_t>(DataType::kUint8, RedOp::kProd, {16, 16}), 0);
  EXPECT_EQ(ReduceScalars<uint8_t>(DataType::kUint8, RedOp::kProd, {255, 255, 255}), 255);
  constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
  constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(ReduceScalars<int32_t>(DataType::kInt32, RedOp::kSum, {kI32Max, 1}), kI32Min);
  EXPECT_EQ(ReduceScalars<int32_t>(DataType::kInt32, RedOp::kProd, {65536, 65536}), 0);
  EXPECT_EQ(ReduceScalars<int32_t>(DataType::kInt32, RedOp::kProd, {kI32Min, -1}), kI32Min);
  EXPECT_EQ(ReduceScalars<uint32_t>(DataType::kUint32, RedOp::kSum, {0xFFFFFFFFu, 2}), 1u);
  constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
  constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(ReduceScalars<int64_t>(DataType::kInt64, RedOp::kSum, {kI64Min, -1}), kI64Max);
  EXPECT_EQ(ReduceScalars<int64_t>(DataType::kInt64, RedOp::kProd, {kI64Min, -1}), kI64Min);
  EXPECT_EQ(ReduceScalars<uint64_t>(DataType::kUint64, RedOp::kSum, {~uint64_t{0}, 3}), 2u);
  EXPECT_EQ(ReduceScalars<uint64_t>(DataType::kUint64, RedOp::kProd,
                                    {uint64_t{1} << 32, uint64_t{1} << 32}),
            0u);
  // Avg: truncating division of the wrapped sum (divisor = number of sources here).
  EXPECT_EQ(ReduceScalars<int8_t>(DataType::kInt8, RedOp::kAvg, {127, 1}), -64);  // -128 / 2
  EXPECT_EQ(ReduceScalars<int32_t>(DataType::kInt32, RedOp::kAvg, {-7, 0}), -3);
  EXPECT_EQ(ReduceScalars<int32_t>(DataType::kInt32, RedOp::kAvg, {7, 0}), 3);
  EXPECT_EQ(ReduceScalars<int32_t>(DataType::kInt32, RedOp::kAvg, {-100, -1, 0}), -33);
  EXPECT_EQ(ReduceScalars<uint8_t>(DataType::kUint8, RedOp::kAvg, {255, 255}), 127);  // 254 / 2
  EXPECT_EQ(ReduceScalars<uint32_t>(DataType::kUint32, RedOp::kAvg, {0xFFFFFFFFu, 1}), 0u);
  EXPECT_EQ(ReduceScalars<int64_t>(DataType::kInt64, RedOp::kAvg, {kI64Min, 0}), kI64Min / 2);
  // Min/max compare as the signed/unsigned type.
  EXPECT_EQ(ReduceScalars<int8_t>(DataType::kInt8, RedOp::kMin, {5, -128, 127}), -128);
  EXPECT_EQ(ReduceScalars<uint8_t>(DataType::kUint8, RedOp::kMax, {5, 200, 127}), 200);
  EXPECT_EQ(ReduceScalars<int64_t>(DataType::kInt64, RedOp::kMax, {kI64Min, -1}), -1);
  EXPECT_EQ(ReduceScalars<uint64_t>(DataType::kUint64, RedOp::kMin, {~uint64_t{0}, 1}), 1u);
  // Avg with an int32 divisor larger than INT32_MAX is still a positive divisor.
  std::vector<int32_t> a = {-2000000000};
  const void* srcs[] = {a.data()};
  int32_t out = 1;
  Reduce(DataType::kInt32, RedOp::kAvg, &out, srcs, 1, 1, 3000000000u);
  EXPECT_EQ(out, 0);
}

// ---------------------------------------------------------------------------------------------
// Copy / Swap.

TEST(CopySwapTest, Copy) {
  std::vector<uint8_t> a(10000), b(10000, 0);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7);
  Copy(b.data(), a.data(), a.size());
  EXPECT_EQ(a, b);
  Copy(a.data(), a.data(), a.size());  // no-op
  EXPECT_EQ(a, b);
}

TEST(CopySwapTest, Swap) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{4095}, size_t{4096}, size_t{4097},
                       size_t{100003}}) {
    SCOPED_TRACE(bytes);
    std::vector<uint8_t> a(bytes), b(bytes);
    for (size_t i = 0; i < bytes; ++i) {
      a[i] = static_cast<uint8_t>(i * 13 + 1);
      b[i] = static_cast<uint8_t>(i * 29 + 7);
    }
    const auto a0 = a, b0 = b;
    Swap(a.data(), b.data(), bytes);
    EXPECT_EQ(a, b0);
    EXPECT_EQ(b, a0);
    Swap(a.data(), a.data(), bytes);  // same region: no-op
    EXPECT_EQ(a, b0);
  }
  // Adjacent halves of one buffer.
  std::vector<uint32_t> v(2000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint32_t>(i);
  Swap(v.data(), v.data() + 1000, 1000 * sizeof(uint32_t));
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(v[i], i + 1000);
    ASSERT_EQ(v[i + 1000], i);
  }
}

// ---------------------------------------------------------------------------------------------
// Names.

// The compressed AllReduce's float32 partial of 16-bit data: widening is exact (and adds in
// float32), narrowing divides in float32 and rounds once to nearest even; NaN and inf survive.
TEST(WidenNarrowTest, SixteenBitRoundTripsAndRoundsOnce) {
  for (const DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    const bool half = dtype == DataType::kFloat16;
    auto bits = [half](float f) { return half ? FloatToHalf(f) : FloatToBFloat16(f); };
    auto value = [half](uint16_t b) { return half ? HalfToFloat(b) : BFloat16ToFloat(b); };
    const std::vector<float> xs = {
        0.f,          -0.f,  1.f,      -2.5f,
        65504.f,      1e-7f, 3.14159f, std::numeric_limits<float>::infinity(),
        std::nanf("")};
    std::vector<uint16_t> in(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) in[i] = bits(xs[i]);
    std::vector<float> wide(xs.size(), 0.f);
    WidenToFloat(dtype, in.data(), wide.data(), in.size(), /*add=*/false);
    for (size_t i = 0; i + 1 < xs.size(); ++i) EXPECT_EQ(wide[i], value(in[i])) << i;
    EXPECT_TRUE(std::isnan(wide.back()));
    WidenToFloat(dtype, in.data(), wide.data(), in.size(), /*add=*/true);
    for (size_t i = 0; i + 1 < xs.size(); ++i) EXPECT_EQ(wide[i], 2 * value(in[i])) << i;
    std::vector<uint16_t> out(xs.size());
    NarrowFromFloat(dtype, wide.data(), out.data(), wide.size(), 2);
    for (size_t i = 0; i + 1 < xs.size(); ++i) EXPECT_EQ(out[i], in[i]) << i;
    EXPECT_TRUE(std::isnan(value(out.back())));
    // 1/3 rounds once, from float32's quotient, to the dtype's nearest value.
    const float three = 3.f;
    NarrowFromFloat(dtype, &three, out.data(), 1, 9);
    EXPECT_EQ(out[0], bits(3.f / 9.f));
    NarrowFromFloat(dtype, &three, out.data(), 1, 1);
    EXPECT_EQ(out[0], bits(3.f));
  }
  std::vector<float> f32 = {1.5f, -7.f};
  std::vector<float> back(2);
  NarrowFromFloat(DataType::kFloat32, f32.data(), back.data(), 2, 0);
  EXPECT_EQ(back, f32);
}

TEST(TypesTest, ElementSize) {
  EXPECT_EQ(ElementSize(DataType::kFloat32), 4u);
  EXPECT_EQ(ElementSize(DataType::kFloat64), 8u);
  EXPECT_EQ(ElementSize(DataType::kFloat16), 2u);
  EXPECT_EQ(ElementSize(DataType::kBFloat16), 2u);
  EXPECT_EQ(ElementSize(DataType::kInt8), 1u);
  EXPECT_EQ(ElementSize(DataType::kUint8), 1u);
  EXPECT_EQ(ElementSize(DataType::kInt32), 4u);
  EXPECT_EQ(ElementSize(DataType::kUint32), 4u);
  EXPECT_EQ(ElementSize(DataType::kInt64), 8u);
  EXPECT_EQ(ElementSize(DataType::kUint64), 8u);
}

TEST(TypesTest, NamesAndRoundTrips) {
  const char* kExpected[] = {"float", "double", "half",   "bfloat16", "int8",
                             "uint8", "int32",  "uint32", "int64",    "uint64"};
  static_assert(std::size(kAllTypes) == kNumDataTypes);
  for (int i = 0; i < kNumDataTypes; ++i) {
    const DataType dtype = kAllTypes[i];
    EXPECT_EQ(Name(dtype), kExpected[i]);
    DataType parsed = DataType::kUint64;
    ASSERT_TRUE(ParseDataType(Name(dtype), &parsed)) << Name(dtype);
    EXPECT_EQ(parsed, dtype);
  }
  const char* kOpNames[] = {"sum", "prod", "min", "max", "avg"};
  static_assert(std::size(kAllOps) == kNumRedOps);
  for (int i = 0; i < kNumRedOps; ++i) {
    EXPECT_EQ(Name(kAllOps[i]), kOpNames[i]);
    RedOp parsed = RedOp::kSum;
    ASSERT_TRUE(ParseRedOp(Name(kAllOps[i]), &parsed));
    EXPECT_EQ(parsed, kAllOps[i]);
  }
}

TEST(TypesTest, Aliases) {
  struct Case {
    const char* name;
    DataType dtype;
  };
  for (const Case& c : {Case{"f32", DataType::kFloat32}, Case{"float32", DataType::kFloat32},
                        Case{"fp32", DataType::kFloat32}, Case{"f64", DataType::kFloat64},
                        Case{"float64", DataType::kFloat64}, Case{"f16", DataType::kFloat16},
                        Case{"float16", DataType::kFloat16}, Case{"fp16", DataType::kFloat16},
                        Case{"bf16", DataType::kBFloat16}, Case{"int", DataType::kInt32},
                        Case{"uint", DataType::kUint32}, Case{"char", DataType::kInt8},
                        Case{"FLOAT", DataType::kFloat32}, Case{"BFloat16", DataType::kBFloat16}}) {
    DataType parsed = DataType::kUint64;
    EXPECT_TRUE(ParseDataType(c.name, &parsed)) << c.name;
    EXPECT_EQ(parsed, c.dtype) << c.name;
  }
  RedOp op = RedOp::kSum;
  EXPECT_TRUE(ParseRedOp("MAX", &op));
  EXPECT_EQ(op, RedOp::kMax);
}

TEST(TypesTest, UnknownNames) {
  DataType dtype = DataType::kInt8;
  for (const char* bad : {"", "float8", "fp8", "floatt", " float", "int16", "complex64"}) {
    EXPECT_FALSE(ParseDataType(bad, &dtype)) << bad;
  }
  EXPECT_EQ(dtype, DataType::kInt8);  // untouched on failure
  RedOp op = RedOp::kMin;
  for (const char* bad : {"", "add", "sum ", "minimum", "xor"}) {
    EXPECT_FALSE(ParseRedOp(bad, &op)) << bad;
  }
  EXPECT_EQ(op, RedOp::kMin);
}

}  // namespace
}  // namespace railyard::kernels
