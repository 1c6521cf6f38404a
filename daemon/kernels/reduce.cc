// CPU reduction kernels.
//
// Design: Reduce()/ReduceToMany() switch on (dtype, op) once per call and jump into one template
// instantiation, ReduceImpl<Kern<Type, Op>>. That function walks the buffers in blocks of
// kBlockBytes / sizeof(Acc) elements. For each block, all sources are combined in order
// (((s0 op s1) op s2) ...) in the accumulate type (float for f32/f16/bf16, double for f64, the
// integer type itself for integers; sums and products in its unsigned twin so they wrap without
// UB) into a small stack accumulator, then the block is converted/rounded once and stored to
// dsts[0] (and memcpy'd, while still in L1, to the other dsts). So: one pass over memory for any
// number of sources; dst may equal any source exactly (block b of every source is fully read
// before block b of any dst is written); float16/bfloat16 are rounded once. One or two sources
// skip the accumulator; one source without avg is a memcpy.
//
// Vectorisation: ReduceImpl carries target_clones("avx2", "default") (an ifunc picks the AVX2
// clone at load time on CPUs that have it; the default clone is baseline x86-64, i.e. SSE2). The
// kernels are built with -O3 (GCC 12's -O2 uses the "very cheap" vectoriser cost model, which
// refuses loops that need a runtime alias check or an epilogue, i.e. all of these) and
// -ffp-contract=off (see daemon/kernels/CMakeLists.txt).
// Verified with GCC 12.2 (-O3 -fdump-tree-vect-optimized, per function and clone), for all 5
// inner loops (Copy1, Fuse2, Init2, Accumulate, Final):
//  - AVX2 clone: vectorised with 32-byte vectors for f32, f64, f16, bf16 and all six integer
//    types, for sum, prod, min, max (the NaN-propagating selects become cmp+blend) and avg; the
//    f16/bf16 conversions in half.h inline into the loops and vectorise (they are branch-free and
//    select with masks). Only integer avg's Copy1/Fuse2/Final stay scalar (no SIMD integer divide).
//  - default clone: the same with 16-byte vectors, except that int64/uint64 prod/min/max stay
//    scalar as well (SSE2 has no 64-bit multiply or compare).
// The alias checks GCC emits for dst vs src accept dst == src (they only reject a dst that starts
// a few elements after a src), so in-place calls take the vector path too.
// To re-check: take the compile command of reduce.cc.o (ninja -t commands) and add
// -fopt-info-vec-optimized (or -fdump-tree-vect-optimized for per-function detail).

#include "daemon/kernels/reduce.h"

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "daemon/kernels/half.h"

// Not under ThreadSanitizer: an ifunc's resolver runs before its runtime is up, and crashes.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__) && \
    !defined(__SANITIZE_THREAD__)
#define RAILYARD_KERNEL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RAILYARD_KERNEL_CLONES
#endif
#define RAILYARD_ALWAYS_INLINE inline __attribute__((always_inline))

namespace railyard::kernels {
namespace {

// Bytes of accumulator per block: 2048 elements for float accumulators, 1024 for double, 8192
// for int8. The accumulator stays in L1 while the sources stream past it.
constexpr size_t kBlockBytes = 8192;

// ---- Storage types: how an element is loaded into / stored from its accumulate type. ----

struct F32 {
  using T = float;
  using Acc = float;
  static constexpr bool kIsFloat = true;
  static RAILYARD_ALWAYS_INLINE Acc Load(T x) { return x; }
  static RAILYARD_ALWAYS_INLINE T Store(Acc a) { return a; }
};

struct F64 {
  using T = double;
  using Acc = double;
  static constexpr bool kIsFloat = true;
  static RAILYARD_ALWAYS_INLINE Acc Load(T x) { return x; }
  static RAILYARD_ALWAYS_INLINE T Store(Acc a) { return a; }
};

struct F16 {
  using T = uint16_t;
  using Acc = float;
  static constexpr bool kIsFloat = true;
  static RAILYARD_ALWAYS_INLINE Acc Load(T x) { return internal::HalfBitsToFloat(x); }
  static RAILYARD_ALWAYS_INLINE T Store(Acc a) { return internal::FloatToHalfBits(a); }
};

struct BF16 {
  using T = uint16_t;
  using Acc = float;
  static constexpr bool kIsFloat = true;
  static RAILYARD_ALWAYS_INLINE Acc Load(T x) { return internal::BFloat16BitsToFloatRaw(x); }
  static RAILYARD_ALWAYS_INLINE T Store(Acc a) { return internal::FloatToBFloat16Bits(a); }
};

template <typename I>
struct Int {
  using T = I;
  static constexpr bool kIsFloat = false;
};

// ---- Kern<S, Op>: the elementwise semantics of one (storage type, op) pair. ----

template <typename S, RedOp kOp>
struct Kern {
  using T = typename S::T;
  static constexpr bool kIsFloat = S::kIsFloat;
  static constexpr bool kIsMinMax = kOp == RedOp::kMin || kOp == RedOp::kMax;

  template <typename X, bool kFloat = kIsFloat>
  struct AccOf {
    using type = typename X::Acc;
  };
  template <typename X>
  struct AccOf<X, false> {
    // Integers: min/max compare in the type itself; sum/prod wrap in the unsigned twin.
    using type = std::conditional_t<kIsMinMax, typename X::T, std::make_unsigned_t<typename X::T>>;
  };
  using Acc = typename AccOf<S>::type;

  // Divisor for kAvg, converted once per call.
  using Div =
      std::conditional_t<kIsFloat, Acc, std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;

  static Div MakeDiv(uint32_t avg_divisor) {
    if constexpr (kIsFloat) {
      return static_cast<Div>(avg_divisor);
    } else {
      return static_cast<Div>(avg_divisor == 0 ? 1 : avg_divisor);  // never trap on / 0
    }
  }

  static RAILYARD_ALWAYS_INLINE Acc Load(T x) {
    if constexpr (kIsFloat) {
      return S::Load(x);
    } else {
      return static_cast<Acc>(x);
    }
  }

  static RAILYARD_ALWAYS_INLINE Acc Combine(Acc a, Acc b) {
    if constexpr (kOp == RedOp::kSum || kOp == RedOp::kAvg) {
      return static_cast<Acc>(a + b);
    } else if constexpr (kOp == RedOp::kProd) {
      return static_cast<Acc>(a * b);
    } else if constexpr (kOp == RedOp::kMin) {
      if constexpr (kIsFloat) {
        // NaN-propagating: a NaN accumulator stays (both tests false); a NaN b is taken.
        return ((b < a) | (b != b)) ? b : a;
      } else {
        return b < a ? b : a;
      }
    } else {
      if constexpr (kIsFloat) {
        return ((b > a) | (b != b)) ? b : a;
      } else {
        return b > a ? b : a;
      }
    }
  }

  static RAILYARD_ALWAYS_INLINE Acc Finish(Acc a, Div d) {
    if constexpr (kOp != RedOp::kAvg) {
      return a;
    } else if constexpr (kIsFloat) {
      return a / d;
    } else if constexpr (std::is_signed_v<T>) {
      // Truncating division of the wrapped signed sum.
      return static_cast<Acc>(static_cast<T>(static_cast<int64_t>(static_cast<T>(a)) / d));
    } else {
      return static_cast<Acc>(a / d);
    }
  }

  static RAILYARD_ALWAYS_INLINE T Store(Acc a) {
    if constexpr (kIsFloat) {
      return S::Store(a);
    } else {
      return static_cast<T>(a);
    }
  }
};

// ---- Inner loops (inlined into each target clone of ReduceImpl). ----

template <typename K>
RAILYARD_ALWAYS_INLINE void Copy1(typename K::T* d, const typename K::T* a, size_t n,
                                  typename K::Div dv) {
  for (size_t i = 0; i < n; ++i) d[i] = K::Store(K::Finish(K::Load(a[i]), dv));
}

template <typename K>
RAILYARD_ALWAYS_INLINE void Fuse2(typename K::T* d, const typename K::T* a, const typename K::T* b,
                                  size_t n, typename K::Div dv) {
  for (size_t i = 0; i < n; ++i) {
    d[i] = K::Store(K::Finish(K::Combine(K::Load(a[i]), K::Load(b[i])), dv));
  }
}

template <typename K>
RAILYARD_ALWAYS_INLINE void Init2(typename K::Acc* acc, const typename K::T* a,
                                  const typename K::T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = K::Combine(K::Load(a[i]), K::Load(b[i]));
}

template <typename K>
RAILYARD_ALWAYS_INLINE void Accumulate(typename K::Acc* acc, const typename K::T* a, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = K::Combine(acc[i], K::Load(a[i]));
}

template <typename K>
RAILYARD_ALWAYS_INLINE void Final(typename K::T* d, const typename K::Acc* acc,
                                  const typename K::T* a, size_t n, typename K::Div dv) {
  for (size_t i = 0; i < n; ++i) d[i] = K::Store(K::Finish(K::Combine(acc[i], K::Load(a[i])), dv));
}

using ReduceFn = void (*)(void* const* dsts, int ndsts, const void* const* srcs, int nsrcs,
                          size_t count, uint32_t avg_divisor);

template <typename K>
RAILYARD_KERNEL_CLONES void ReduceImpl(void* const* dsts, int ndsts, const void* const* srcs,
                                       int nsrcs, size_t count, uint32_t avg_divisor) {
  using T = typename K::T;
  using Acc = typename K::Acc;
  constexpr size_t kBlock = kBlockBytes / sizeof(Acc);
  const typename K::Div dv = K::MakeDiv(avg_divisor);
  T* const d0 = static_cast<T*>(dsts[0]);
  alignas(64) Acc acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = std::min(kBlock, count - base);
    T* const d = d0 + base;
    const T* const s0 = static_cast<const T*>(srcs[0]) + base;
    if (nsrcs == 1) {
      Copy1<K>(d, s0, n, dv);
    } else if (nsrcs == 2) {
      Fuse2<K>(d, s0, static_cast<const T*>(srcs[1]) + base, n, dv);
    } else {
      Init2<K>(acc, s0, static_cast<const T*>(srcs[1]) + base, n);
      for (int s = 2; s < nsrcs - 1; ++s) {
        Accumulate<K>(acc, static_cast<const T*>(srcs[s]) + base, n);
      }
      Final<K>(d, acc, static_cast<const T*>(srcs[nsrcs - 1]) + base, n, dv);
    }
    // The other dsts get the block while it is still in L1.
    for (int k = 1; k < ndsts; ++k) {
      T* const dk = static_cast<T*>(dsts[k]);
      if (dk != d0) std::memcpy(dk + base, d, n * sizeof(T));
    }
  }
}

template <typename S>
ReduceFn PickOp(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return &ReduceImpl<Kern<S, RedOp::kSum>>;
    case RedOp::kProd:
      return &ReduceImpl<Kern<S, RedOp::kProd>>;
    case RedOp::kMin:
      return &ReduceImpl<Kern<S, RedOp::kMin>>;
    case RedOp::kMax:
      return &ReduceImpl<Kern<S, RedOp::kMax>>;
    case RedOp::kAvg:
      return &ReduceImpl<Kern<S, RedOp::kAvg>>;
  }
  return nullptr;
}

ReduceFn Pick(DataType dtype, RedOp op) {
  switch (dtype) {
    case DataType::kFloat32:
      return PickOp<F32>(op);
    case DataType::kFloat64:
      return PickOp<F64>(op);
    case DataType::kFloat16:
      return PickOp<F16>(op);
    case DataType::kBFloat16:
      return PickOp<BF16>(op);
    case DataType::kInt8:
      return PickOp<Int<int8_t>>(op);
    case DataType::kUint8:
      return PickOp<Int<uint8_t>>(op);
    case DataType::kInt32:
      return PickOp<Int<int32_t>>(op);
    case DataType::kUint32:
      return PickOp<Int<uint32_t>>(op);
    case DataType::kInt64:
      return PickOp<Int<int64_t>>(op);
    case DataType::kUint64:
      return PickOp<Int<uint64_t>>(op);
  }
  return nullptr;
}

}  // namespace

void Reduce(DataType dtype, RedOp op, void* dst, const void* const* srcs, int nsrcs, size_t count,
            uint32_t avg_divisor) {
  void* const dsts[1] = {dst};
  ReduceToMany(dtype, op, dsts, 1, srcs, nsrcs, count, avg_divisor);
}

void ReduceToMany(DataType dtype, RedOp op, void* const* dsts, int ndsts, const void* const* srcs,
                  int nsrcs, size_t count, uint32_t avg_divisor) {
  if (count == 0 || ndsts < 1) return;
  assert(nsrcs >= 1);
  assert(op != RedOp::kAvg || avg_divisor > 0);
  if (nsrcs < 1) return;
  if (nsrcs == 1 && op != RedOp::kAvg) {
    // A plain copy (bit-exact, NaN payloads included).
    const size_t bytes = count * ElementSize(dtype);
    for (int k = 0; k < ndsts; ++k) Copy(dsts[k], srcs[0], bytes);
    return;
  }
  const ReduceFn fn = Pick(dtype, op);
  assert(fn != nullptr);
  if (fn == nullptr) return;
  fn(dsts, ndsts, srcs, nsrcs, count, avg_divisor);
}

void Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  std::memcpy(dst, src, bytes);
}

void Swap(void* a, void* b, size_t bytes) {
  if (bytes == 0 || a == b) return;
  constexpr size_t kChunk = 4096;
  alignas(64) unsigned char tmp[kChunk];
  auto* pa = static_cast<unsigned char*>(a);
  auto* pb = static_cast<unsigned char*>(b);
  for (size_t off = 0; off < bytes; off += kChunk) {
    const size_t n = std::min(kChunk, bytes - off);
    std::memcpy(tmp, pa + off, n);
    std::memcpy(pa + off, pb + off, n);
    std::memcpy(pb + off, tmp, n);
  }
}

namespace {

template <typename S>
void WidenImpl(const void* src, float* dst, size_t n, bool add) {
  const auto* in = static_cast<const typename S::T*>(src);
  if (add) {
    for (size_t i = 0; i < n; ++i) dst[i] += S::Load(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = S::Load(in[i]);
  }
}

template <typename S>
void NarrowImpl(const float* src, void* dst, size_t n, uint32_t divisor) {
  auto* out = static_cast<typename S::T*>(dst);
  if (divisor > 1) {
    const auto d = static_cast<float>(divisor);
    for (size_t i = 0; i < n; ++i) out[i] = S::Store(src[i] / d);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = S::Store(src[i]);
  }
}

}  // namespace

void WidenToFloat(DataType dtype, const void* src, float* dst, size_t n, bool add) {
  switch (dtype) {
    case DataType::kFloat32:
      return WidenImpl<F32>(src, dst, n, add);
    case DataType::kFloat16:
      return WidenImpl<F16>(src, dst, n, add);
    case DataType::kBFloat16:
      return WidenImpl<BF16>(src, dst, n, add);
    default:
      assert(false && "WidenToFloat: float32, float16 or bfloat16 only");
  }
}

void NarrowFromFloat(DataType dtype, const float* src, void* dst, size_t n, uint32_t divisor) {
  switch (dtype) {
    case DataType::kFloat32:
      return NarrowImpl<F32>(src, dst, n, divisor);
    case DataType::kFloat16:
      return NarrowImpl<F16>(src, dst, n, divisor);
    case DataType::kBFloat16:
      return NarrowImpl<BF16>(src, dst, n, divisor);
    default:
      assert(false && "NarrowFromFloat: float32, float16 or bfloat16 only");
  }
}

uint16_t FloatToHalf(float f) { return internal::FloatToHalfBits(f); }
float HalfToFloat(uint16_t h) { return internal::HalfBitsToFloat(h); }
uint16_t FloatToBFloat16(float f) { return internal::FloatToBFloat16Bits(f); }
float BFloat16ToFloat(uint16_t b) { return internal::BFloat16BitsToFloat(b); }

}  // namespace railyard::kernels
