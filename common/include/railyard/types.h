// The element types and reduction operators of Railyard's API, as the client, the daemon's
// kernels and the tools all name them: memory layout only. Lives in common/ (library
// railyard_types) because both sides include it: it is part of the C++ client's public API, and
// the daemon's kernels see it as railyard::kernels::* (daemon/kernels/types.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace railyard {

enum class DataType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUint8,
  kInt32,
  kUint32,
  kInt64,
  kUint64,
};
inline constexpr int kNumDataTypes = 10;

enum class RedOp : uint8_t { kSum, kProd, kMin, kMax, kAvg };
inline constexpr int kNumRedOps = 5;

// Bytes per element.
size_t ElementSize(DataType dtype);
// nccl-tests spelling: "float", "double", "half", "bfloat16", "int8", "uint8", "int32", "uint32",
// "int64", "uint64"; and "sum", "prod", "min", "max", "avg".
std::string_view Name(DataType dtype);
std::string_view Name(RedOp op);
// Inverse of Name(); also accepts nccl-tests aliases ("f32", "float32", "f16", "float16", "bf16",
// "int", "uint", ...). Returns false for an unknown name.
bool ParseDataType(std::string_view name, DataType* out);
bool ParseRedOp(std::string_view name, RedOp* out);

}  // namespace railyard
