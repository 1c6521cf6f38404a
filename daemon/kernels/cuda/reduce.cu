// Device-memory Reduce: one templated grid-stride elementwise kernel, instantiated per
// (dtype, op). Each thread reads element i of every source, combines them in order in the
// accumulate type (float for f32/f16/bf16, double for f64, the integer type (unsigned twin for
// sum/prod) for integers), then stores once; so in-place (dst == a src) is safe.

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

struct SrcArray {
  const void* p[RAILYARD_CUDA_MAX_SRCS];
};

template <typename K>
__global__ void ReduceKernel(void* dst_v, SrcArray srcs, int nsrcs, size_t count,
                             typename K::Div dv) {
  using T = typename K::T;
  T* dst = static_cast<T*>(dst_v);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    typename K::Acc a = K::Load(static_cast<const T*>(srcs.p[0])[i]);
    for (int s = 1; s < nsrcs; ++s) a = K::Combine(a, K::Load(static_cast<const T*>(srcs.p[s])[i]));
    dst[i] = K::Store(K::Finish(a, dv));
  }
}

template <typename K>
cudaError_t Launch(void* dst, const SrcArray& srcs, int nsrcs, size_t count, uint32_t avg_divisor,
                   cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  constexpr size_t kMaxBlocks = 8192;
  size_t blocks = (count + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  using Div = typename K::Div;
  const Div dv = static_cast<Div>(avg_divisor == 0 ? 1u : avg_divisor);
  ReduceKernel<K>
      <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(dst, srcs, nsrcs, count, dv);
  return cudaGetLastError();
}

template <typename S>
cudaError_t DispatchOp(int op, void* dst, const SrcArray& srcs, int nsrcs, size_t count,
                       uint32_t avg_divisor, cudaStream_t stream) {
  switch (op) {
    case kSum:
      return Launch<Kern<S, kSum>>(dst, srcs, nsrcs, count, avg_divisor, stream);
    case kProd:
      return Launch<Kern<S, kProd>>(dst, srcs, nsrcs, count, avg_divisor, stream);
    case kMin:
      return Launch<Kern<S, kMin>>(dst, srcs, nsrcs, count, avg_divisor, stream);
    case kMax:
      return Launch<Kern<S, kMax>>(dst, srcs, nsrcs, count, avg_divisor, stream);
    case kAvg:
      return Launch<Kern<S, kAvg>>(dst, srcs, nsrcs, count, avg_divisor, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace
}  // namespace railyard::kernels::cuda

extern "C" int railyard_cuda_reduce(int dtype, int op, void* dst, const void* const* srcs,
                                    int nsrcs, size_t count, uint32_t avg_divisor,
                                    struct CUstream_st* stream) {
  using namespace railyard::kernels::cuda;
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || srcs == nullptr || nsrcs < 1 || nsrcs > RAILYARD_CUDA_MAX_SRCS) {
    return cudaErrorInvalidValue;
  }
  SrcArray arr{};
  for (int s = 0; s < nsrcs; ++s) {
    if (srcs[s] == nullptr) return cudaErrorInvalidValue;
    arr.p[s] = srcs[s];
  }
  switch (dtype) {  // railyard::kernels::DataType order
    case 0:
      return DispatchOp<F32>(op, dst, arr, nsrcs, count, avg_divisor, stream);
    case 1:
      return DispatchOp<F64>(op, dst, arr, nsrcs, count, avg_divisor, stream);
    case 2:
      return DispatchOp<F16>(op, dst, arr, nsrcs, count, avg_divisor, stream);
    case 3:
      return DispatchOp<BF16>(op, dst, arr, nsrcs, count, avg_divisor, stream);
    case 4:
      return DispatchOp<Int<int8_t>>(op, dst, arr, nsrcs, count, avg_divisor, stream);
    case 5:
      return DispatchOp<Int<uint8_t>>(op, dst, arr, nsrcs, count, avg_divisor, stream);
    case 6:
      return DispatchOp<Int<int32_t>>(op, dst, arr, nsrcs, count, avg_divisor, stream);
    case 7:
      return DispatchOp<Int<uint32_t>>(op, dst, arr, nsrcs, count, avg_divisor, stream);
    case 8:
      return DispatchOp<Int<int64_t>>(op, dst, arr, nsrcs, count, avg_divisor, stream);
    case 9:
      return DispatchOp<Int<uint64_t>>(op, dst, arr, nsrcs, count, avg_divisor, stream);
    default:
      return cudaErrorInvalidValue;
  }
}
