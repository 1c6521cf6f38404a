// Device-memory Reduce behind a plain C boundary, so that host code built without nvcc can call
// it. Semantics are those of railyard::kernels::Reduce (daemon/kernels/reduce.h): float16/bfloat16
// accumulate in float32 and round once (round-to-nearest-even), integer sum/prod wrap, min/max
// propagate NaN, avg divides the sum by avg_divisor, dst may equal any source exactly.
// Only built when RAILYARD_WITH_CUDA is ON (target railyard_kernels_cuda).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// cudaStream_t is `struct CUstream_st*`; declared here so this header does not need the CUDA
// headers. Pass a cudaStream_t (or NULL for the legacy default stream).
struct CUstream_st;

// Most sources one call accepts (the device pointers travel as a kernel argument).
#define RAILYARD_CUDA_MAX_SRCS 32

// dst[i] = srcs[0][i] (op) ... (op) srcs[nsrcs-1][i], i in [0, count), asynchronously on `stream`.
// dtype: a railyard::kernels::DataType value (kFloat32 = 0 ... kUint64 = 9).
// op: a railyard::kernels::RedOp value (kSum = 0, kProd, kMin, kMax, kAvg = 4).
// dst and srcs[k] are device pointers; the srcs array itself is host memory (it is copied into
// the launch). Returns 0 (cudaSuccess) when the kernel was launched (or count == 0), 1
// (cudaErrorInvalidValue) for a bad dtype/op/nsrcs/pointer, or the cudaError_t of the launch.
int railyard_cuda_reduce(int dtype, int op, void* dst, const void* const* srcs, int nsrcs,
                         size_t count, uint32_t avg_divisor, struct CUstream_st* stream);

// Reduces like railyard_cuda_reduce into every dsts[d], d in [0, ndsts): one pass over the
// sources (railyard::kernels::ReduceToMany on the device). 1 <= ndsts <= RAILYARD_CUDA_MAX_SRCS;
// any dst may equal any src exactly. Same return values.
int railyard_cuda_reduce_to_many(int dtype, int op, void* const* dsts, int ndsts,
                                 const void* const* srcs, int nsrcs, size_t count,
                                 uint32_t avg_divisor, struct CUstream_st* stream);

// Copies bytes between device pointers on `stream` (cudaMemcpyAsync); nothing when dst == src.
int railyard_cuda_copy(void* dst, const void* src, size_t bytes, struct CUstream_st* stream);

// Exchanges two non-overlapping device regions of `bytes` bytes on `stream`.
int railyard_cuda_swap(void* a, void* b, size_t bytes, struct CUstream_st* stream);

// cudaGetErrorString of a value these functions returned.
const char* railyard_cuda_error_string(int error);

#ifdef __cplusplus
}  // extern "C"
#endif
