// CPU reduction and copy kernels. They know nothing but memory: no collectives, no ranks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "daemon/kernels/types.h"

namespace railyard::kernels {

// dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[nsrcs-1][i] for i in [0, count).
// For RedOp::kAvg the sum is divided by avg_divisor (> 0) before it is stored.
// float16/bfloat16 are accumulated in float32 over all sources and rounded once
// (round-to-nearest-even) when stored. Integer sums and products wrap modulo 2^bits (no UB).
// min/max propagate NaN (like numpy.minimum): if any source element is NaN the result is NaN.
// dst may be exactly equal to any source pointer (in-place); partial overlaps are undefined.
// nsrcs >= 1; nsrcs == 1 is a copy (with the avg division applied for kAvg).
void Reduce(DataType dtype, RedOp op, void* dst, const void* const* srcs, int nsrcs, size_t count,
            uint32_t avg_divisor);

// Reduces like Reduce() into dsts[0], and stores the same result into dsts[1..ndsts-1].
// Any dst may equal any src exactly. One pass over the sources (blocked, cache resident).
void ReduceToMany(DataType dtype, RedOp op, void* const* dsts, int ndsts, const void* const* srcs,
                  int nsrcs, size_t count, uint32_t avg_divisor);

// Copies bytes; a no-op when dst == src.
void Copy(void* dst, const void* src, size_t bytes);

// Exchanges two non-overlapping regions in place (in-place AllToAll).
void Swap(void* a, void* b, size_t bytes);

// The compressed AllReduce's float32 partial of float32, float16 or bfloat16 data (compressed.h).
// WidenToFloat: dst[i] = float(src[i]), or dst[i] += float(src[i]) when add (exact: every
// float16/bfloat16 value is a float32). NarrowFromFloat: dst[i] = src[i] / divisor stored as
// dtype, rounded once (round-to-nearest-even); divisor 0 or 1 stores src[i] unchanged. Other
// dtypes are not supported (assert; they do nothing in release builds).
void WidenToFloat(DataType dtype, const void* src, float* dst, size_t n, bool add);
void NarrowFromFloat(DataType dtype, const float* src, void* dst, size_t n, uint32_t divisor);

// Scalar conversions, round-to-nearest-even, NaN stays NaN, overflow goes to infinity.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBFloat16(float f);
float BFloat16ToFloat(uint16_t b);

}  // namespace railyard::kernels
