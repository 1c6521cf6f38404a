// What NCCL's C API and railyard's client say differently: element types and reductions, the
// result codes statuses map to, PreMulSum's scaling, and NCCL's spelling of each.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "railyard/types.h"

namespace railyard::nccl {

// False (with why) for an ncclDataType_t railyard has no kernels for (the float8 types) or that
// is not one at all: ncclInvalidUsage and ncclInvalidArgument respectively.
ncclResult_t ToDataType(ncclDataType_t t, DataType* out, std::string* why);
// Built-in ops only; PreMulSum ops are the communicator's (ncclComm::PreMulSumOf).
bool ToRedOp(ncclRedOp_t op, RedOp* out);
size_t ElementBytes(ncclDataType_t t);  // 0 for an invalid type

// The NCCL result a failed railyard status maps to: INVALID_ARGUMENT -> ncclInvalidArgument;
// FAILED_PRECONDITION, UNIMPLEMENTED, ALREADY_EXISTS -> ncclInvalidUsage; UNAVAILABLE, ABORTED,
// DEADLINE_EXCEEDED, CANCELLED, DATA_LOSS, PERMISSION_DENIED, UNAUTHENTICATED ->
// ncclRemoteError (a peer, its daemon or the fabric); RESOURCE_EXHAUSTED -> ncclSystemError;
// the rest ncclInternalError.
ncclResult_t ResultOf(const absl::Status& s);

// Multiplies n elements of type t at data by the scalar at `scalar` (of type t): PreMulSum's
// scaling, done here on host memory before the sum.
void Scale(void* data, size_t n, ncclDataType_t t, const void* scalar);

const char* ErrorString(ncclResult_t r);

// IEEE half and bfloat16 from and to float (round to nearest even).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);

}  // namespace railyard::nccl
