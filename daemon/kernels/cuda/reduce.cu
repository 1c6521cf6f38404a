// Device-memory Reduce: one templated grid-stride kernel per (dtype, op), in two widths: 16-byte
// vectors where every pointer is 16-byte aligned (the common case: buffers come from cuMemCreate),
// single elements otherwise. Each thread reads its elements of every source, combines them in
// order in the accumulate type (float for f32/f16/bf16, double for f64, the integer type
// (unsigned twin for sum/prod) for integers), then stores the result into every destination:
// one pass over the sources however many outputs there are (the shape of the CPU path's
// ReduceToMany), and in place (a dst equal to a src) is safe.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "daemon/kernels/cuda/reduce_cuda.h"

namespace railyard::kernels::cuda {
namespace {

enum Op { kSum = 0, kProd = 1, kMin = 2, kMax = 3, kAvg = 4 };

struct F32 {
  using T = float;
  using Acc = float;
  static constexpr bool kIsFloat = true;
  static __device__ __forceinline__ Acc Load(T x) { return x; }
  static __device__ __forceinline__ T Store(Acc a) { return a; }
};
struct F64 {
  using T = double;
  using Acc = double;
  static constexpr bool kIsFloat = true;
  static __device__ __forceinline__ Acc Load(T x) { return x; }
  static __device__ __forceinline__ T Store(Acc a) { return a; }
};
struct F16 {
  using T = unsigned short;
  using Acc = float;
  static constexpr bool kIsFloat = true;
  static __device__ __forceinline__ Acc Load(T x) { return __half2float(__ushort_as_half(x)); }
  static __device__ __forceinline__ T Store(Acc a) { return __half_as_ushort(__float2half_rn(a)); }
};
struct BF16 {
  using T = unsigned short;
  using Acc = float;
  static constexpr bool kIsFloat = true;
  static __device__ __forceinline__ Acc Load(T x) {
    return __bfloat162float(__ushort_as_bfloat16(x));
  }
  static __device__ __forceinline__ T Store(Acc a) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(a));
  }
};
template <typename I>
struct Int {
  using T = I;
  // Sum/prod wrap in the unsigned twin; min/max compare in the type itself.
  using Acc = std::make_unsigned_t<I>;
  static constexpr bool kIsFloat = false;
};

template <typename S, int kOp>
struct Kern {
  using T = typename S::T;
  static constexpr bool kIsMinMax = kOp == kMin || kOp == kMax;
  using Acc = std::conditional_t<S::kIsFloat || !kIsMinMax, typename S::Acc, T>;
  using Div = std::conditional_t<S::kIsFloat, Acc,
                                 std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;

  static __device__ __forceinline__ Acc Load(T x) {
    if constexpr (S::kIsFloat) {
      return S::Load(x);
    } else {
      return static_cast<Acc>(x);
    }
  }
  static __device__ __forceinline__ Acc Combine(Acc a, Acc b) {
    if constexpr (kOp == kSum || kOp == kAvg) {
      return static_cast<Acc>(a + b);
    } else if constexpr (kOp == kProd) {
      return static_cast<Acc>(a * b);
    } else if constexpr (!S::kIsFloat) {
      return (kOp == kMin ? b < a : b > a) ? b : a;
    } else if constexpr (kOp == kMin) {
      return ((b < a) | (b != b)) ? b : a;  // NaN-propagating: a NaN a stays, a NaN b is taken
    } else {
      return ((b > a) | (b != b)) ? b : a;
    }
  }
  static __device__ __forceinline__ Acc Finish(Acc a, Div d) {
    if constexpr (kOp != kAvg) {
      return a;
    } else if constexpr (S::kIsFloat) {
      return a / d;
    } else if constexpr (std::is_signed_v<T>) {
      return static_cast<Acc>(static_cast<T>(static_cast<int64_t>(static_cast<T>(a)) / d));
    } else {
      return static_cast<Acc>(a / d);
    }
  }
  static __device__ __forceinline__ T Store(Acc a) {
    if constexpr (S::kIsFloat) {
      return S::Store(a);
    } else {
      return static_cast<T>(a);
    }
  }
};

struct PtrArray {
  const void* p[RAILYARD_CUDA_MAX_SRCS];
};

// V elements of T moved as one 16-byte (or narrower, for V == 1) load/store.
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// Element i (in units of V elements) of every source, combined in order, stored into every
// destination. Each thread loads its elements of every source before it stores any, so a
// destination equal to a source is safe. Elements past nvec * V (the tail a vector does not
// cover) are done one by one by the first threads.
template <typename K, int V>
__global__ void ReduceKernel(PtrArray dsts, int ndsts, PtrArray srcs, int nsrcs, size_t nvec,
                             size_t count, typename K::Div dv) {
  using T = typename K::T;
  using W = Vec<T, V>;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t i = first; i < nvec; i += stride) {
    const W w0 = static_cast<const W*>(srcs.p[0])[i];
    typename K::Acc a[V];
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = K::Load(w0.v[j]);
    for (int s = 1; s < nsrcs; ++s) {
      const W w = static_cast<const W*>(srcs.p[s])[i];
#pragma unroll
      for (int j = 0; j < V; ++j) a[j] = K::Combine(a[j], K::Load(w.v[j]));
    }
    W out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = K::Store(K::Finish(a[j], dv));
    for (int d = 0; d < ndsts; ++d) static_cast<W*>(const_cast<void*>(dsts.p[d]))[i] = out;
  }
  for (size_t i = nvec * V + first; i < count; i += stride) {
    typename K::Acc a = K::Load(static_cast<const T*>(srcs.p[0])[i]);
    for (int s = 1; s < nsrcs; ++s) a = K::Combine(a, K::Load(static_cast<const T*>(srcs.p[s])[i]));
    const T out = K::Store(K::Finish(a, dv));
    for (int d = 0; d < ndsts; ++d) static_cast<T*>(const_cast<void*>(dsts.p[d]))[i] = out;
  }
}

constexpr unsigned kThreads = 256;
// Enough blocks to fill any current GPU (an H200 holds 132 x 2048 threads) several times over;
// the grid-stride loop covers the rest.
constexpr size_t kMaxBlocks = 4096;

unsigned Blocks(size_t items) {
  size_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks == 0 ? 1 : blocks);
}

bool Aligned16(const PtrArray& a, int n) {
  for (int k = 0; k < n; ++k) {
    if (reinterpret_cast<uintptr_t>(a.p[k]) % 16 != 0) return false;
  }
  return true;
}

template <typename K>
cudaError_t Launch(const PtrArray& dsts, int ndsts, const PtrArray& srcs, int nsrcs, size_t count,
                   uint32_t avg_divisor, cudaStream_t stream) {
  using T = typename K::T;
  using Div = typename K::Div;
  const Div dv = static_cast<Div>(avg_divisor == 0 ? 1u : avg_divisor);
  constexpr int kVec = 16 / sizeof(T);
  if (Aligned16(dsts, ndsts) && Aligned16(srcs, nsrcs)) {
    const size_t nvec = count / kVec;
    ReduceKernel<K, kVec><<<Blocks(nvec == 0 ? count : nvec), kThreads, 0, stream>>>(
        dsts, ndsts, srcs, nsrcs, nvec, count, dv);
  } else {
    ReduceKernel<K, 1>
        <<<Blocks(count), kThreads, 0, stream>>>(dsts, ndsts, srcs, nsrcs, count, count, dv);
  }
  return cudaGetLastError();
}

// Exchanges two regions, 16 bytes at a time where both are aligned.
template <typename W>
__global__ void SwapKernel(W* a, W* b, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const W t = a[i];
    a[i] = b[i];
    b[i] = t;
  }
}

template <typename S>
cudaError_t DispatchOp(int op, const PtrArray& dsts, int ndsts, const PtrArray& srcs, int nsrcs,
                       size_t count, uint32_t avg_divisor, cudaStream_t stream) {
  switch (op) {
    case kSum:
      return Launch<Kern<S, kSum>>(dsts, ndsts, srcs, nsrcs, count, avg_divisor, stream);
    case kProd:
      return Launch<Kern<S, kProd>>(dsts, ndsts, srcs, nsrcs, count, avg_divisor, stream);
    case kMin:
      return Launch<Kern<S, kMin>>(dsts, ndsts, srcs, nsrcs, count, avg_divisor, stream);
    case kMax:
      return Launch<Kern<S, kMax>>(dsts, ndsts, srcs, nsrcs, count, avg_divisor, stream);
    case kAvg:
      return Launch<Kern<S, kAvg>>(dsts, ndsts, srcs, nsrcs, count, avg_divisor, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace
}  // namespace railyard::kernels::cuda

extern "C" int railyard_cuda_reduce_to_many(int dtype, int op, void* const* dsts, int ndsts,
                                            const void* const* srcs, int nsrcs, size_t count,
                                            uint32_t avg_divisor, struct CUstream_st* stream) {
  using namespace railyard::kernels::cuda;
  if (dsts == nullptr || srcs == nullptr || nsrcs < 1 || nsrcs > RAILYARD_CUDA_MAX_SRCS ||
      ndsts < 1 || ndsts > RAILYARD_CUDA_MAX_SRCS || dtype < 0 || dtype > 9 || op < 0 || op > 4) {
    return cudaErrorInvalidValue;
  }
  if (count == 0) return cudaSuccess;
  PtrArray arr{};
  PtrArray out{};
  for (int s = 0; s < nsrcs; ++s) {
    if (srcs[s] == nullptr) return cudaErrorInvalidValue;
    arr.p[s] = srcs[s];
  }
  for (int d = 0; d < ndsts; ++d) {
    if (dsts[d] == nullptr) return cudaErrorInvalidValue;
    out.p[d] = dsts[d];
  }
  switch (dtype) {  // railyard::kernels::DataType order
    case 0:
      return DispatchOp<F32>(op, out, ndsts, arr, nsrcs, count, avg_divisor, stream);
    case 1:
      return DispatchOp<F64>(op, out, ndsts, arr, nsrcs, count, avg_divisor, stream);
    case 2:
      return DispatchOp<F16>(op, out, ndsts, arr, nsrcs, count, avg_divisor, stream);
    case 3:
      return DispatchOp<BF16>(op, out, ndsts, arr, nsrcs, count, avg_divisor, stream);
    case 4:
      return DispatchOp<Int<int8_t>>(op, out, ndsts, arr, nsrcs, count, avg_divisor, stream);
    case 5:
      return DispatchOp<Int<uint8_t>>(op, out, ndsts, arr, nsrcs, count, avg_divisor, stream);
    case 6:
      return DispatchOp<Int<int32_t>>(op, out, ndsts, arr, nsrcs, count, avg_divisor, stream);
    case 7:
      return DispatchOp<Int<uint32_t>>(op, out, ndsts, arr, nsrcs, count, avg_divisor, stream);
    case 8:
      return DispatchOp<Int<int64_t>>(op, out, ndsts, arr, nsrcs, count, avg_divisor, stream);
    case 9:
      return DispatchOp<Int<uint64_t>>(op, out, ndsts, arr, nsrcs, count, avg_divisor, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

extern "C" int railyard_cuda_reduce(int dtype, int op, void* dst, const void* const* srcs,
                                    int nsrcs, size_t count, uint32_t avg_divisor,
                                    struct CUstream_st* stream) {
  return railyard_cuda_reduce_to_many(dtype, op, &dst, 1, srcs, nsrcs, count, avg_divisor, stream);
}

extern "C" int railyard_cuda_copy(void* dst, const void* src, size_t bytes,
                                  struct CUstream_st* stream) {
  if (bytes == 0 || dst == src) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
}

extern "C" int railyard_cuda_swap(void* a, void* b, size_t bytes, struct CUstream_st* stream) {
  using namespace railyard::kernels::cuda;
  if (bytes == 0 || a == b) return cudaSuccess;
  if (a == nullptr || b == nullptr) return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0 &&
      bytes % 16 == 0) {
    SwapKernel<uint4><<<Blocks(bytes / 16), kThreads, 0, stream>>>(
        static_cast<uint4*>(a), static_cast<uint4*>(b), bytes / 16);
  } else {
    SwapKernel<unsigned char><<<Blocks(bytes), kThreads, 0, stream>>>(
        static_cast<unsigned char*>(a), static_cast<unsigned char*>(b), bytes);
  }
  return cudaGetLastError();
}

extern "C" const char* railyard_cuda_error_string(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}
