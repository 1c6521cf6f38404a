// Data validation for railyard-perf: deterministic inputs every rank can recompute for every other
// rank, the reference result computed locally, and the count of wrong elements.
//
// Inputs are small integers, exact in every data type, so sums and products are exact too and the
// reference can follow the kernels' semantics (daemon/kernels/reduce.h) literally: integers wrap,
// float16/bfloat16 accumulate in float32 and round once, avg = sum / nranks (integers truncate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "daemon/kernels/types.h"
#include "tools/perf/perf_op.h"

namespace railyard::perf {

using kernels::DataType;
using kernels::RedOp;

// What a checked iteration's inputs depend on. A new seed per checked iteration makes every check
// see fresh data, so stale results from earlier iterations cannot pass.
struct PatternParams {
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;  // shapes the values: kProd uses +-1 and 2 so that products stay exact
  int nranks = 1;
  uint64_t seed = 0;
};

// Element `index` of `rank`'s input, as an integer. Sum/min/max/avg: 0..10 (unsigned) or -5..5;
// 8-bit avg: 0..2 or -1..1 (no wrap before the division); prod: one rank per element has
// magnitude 2, the others 1, some negative (signed types).
int64_t PatternValue(const PatternParams& params, int rank, size_t index);

// Writes elements [first, first + count) of `rank`'s input into dst (count elements of dtype).
void FillInput(const PatternParams& params, int rank, size_t first, size_t count, void* dst);

// Writes into dst the reduction over all ranks of elements [first, first + count) of their
// inputs, as the daemon must compute it.
void FillReduced(const PatternParams& params, size_t first, size_t count, void* dst);

// Fills count elements with a value no check expects, so that untouched results count as wrong.
void FillSentinel(DataType dtype, size_t count, void* dst);

// Number of elements of got that differ from expected: integers exactly; floating types within a
// couple of units in the last place (relative, floored at 1).
size_t CountWrong(DataType dtype, const void* got, const void* expected, size_t count);

// A region of the result operand (elements from the start of the recv buffer) and what it must
// hold: elements [first, first + count) of `source_rank`'s input, or of the reduction over all
// ranks when source_rank is kReduced.
struct ExpectedRegion {
  static constexpr int kReduced = -1;
  size_t offset = 0;
  size_t count = 0;
  int source_rank = kReduced;
  size_t first = 0;
};

// The regions `rank` must check after one operation (empty when it receives nothing: Reduce's
// non-root ranks, Barrier).
std::vector<ExpectedRegion> ExpectedRegions(PerfOp op, const OpLayout& layout, int rank, int nranks,
                                            int root, bool in_place);

// Float conversions used by the reference, written independently of the kernels' (half.h) so
// that the check does not share their bugs. Round-to-nearest-even, overflow to infinity.
uint16_t ReferenceFloatToHalf(float value);
float ReferenceHalfToFloat(uint16_t bits);
uint16_t ReferenceFloatToBFloat16(float value);
float ReferenceBFloat16ToFloat(uint16_t bits);

}  // namespace railyard::perf
