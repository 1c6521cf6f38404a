#include "railyard/types.h"

#include <cstddef>
#include <string_view>

namespace railyard {
namespace {

struct DataTypeName {
  std::string_view name;
  DataType dtype;
};

// Canonical (nccl-tests) names first, so they win in Name(); then aliases.
constexpr DataTypeName kDataTypeNames[] = {
    {"float", DataType::kFloat32},
    {"double", DataType::kFloat64},
    {"half", DataType::kFloat16},
    {"bfloat16", DataType::kBFloat16},
    {"int8", DataType::kInt8},
    {"uint8", DataType::kUint8},
    {"int32", DataType::kInt32},
    {"uint32", DataType::kUint32},
    {"int64", DataType::kInt64},
    {"uint64", DataType::kUint64},
    // Aliases (nccl-tests / ncclDataType_t / numpy / torch spellings).
    {"f32", DataType::kFloat32},
    {"float32", DataType::kFloat32},
    {"fp32", DataType::kFloat32},
    {"f64", DataType::kFloat64},
    {"float64", DataType::kFloat64},
    {"fp64", DataType::kFloat64},
    {"f16", DataType::kFloat16},
    {"float16", DataType::kFloat16},
    {"fp16", DataType::kFloat16},
    {"bf16", DataType::kBFloat16},
    {"char", DataType::kInt8},
    {"i8", DataType::kInt8},
    {"u8", DataType::kUint8},
    {"int", DataType::kInt32},
    {"i32", DataType::kInt32},
    {"uint", DataType::kUint32},
    {"u32", DataType::kUint32},
    {"i64", DataType::kInt64},
    {"u64", DataType::kUint64},
};

struct RedOpName {
  std::string_view name;
  RedOp op;
};

constexpr RedOpName kRedOpNames[] = {
    {"sum", RedOp::kSum},
    {"prod", RedOp::kProd},
    {"min", RedOp::kMin},
    {"max", RedOp::kMax},
    {"avg", RedOp::kAvg},
    // Aliases.
    {"product", RedOp::kProd},
    {"mean", RedOp::kAvg},
    {"average", RedOp::kAvg},
};

char ToLower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// ASCII case-insensitive equality.
bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (ToLower(a[i]) != ToLower(b[i])) return false;
  }
  return true;
}

}  // namespace

size_t ElementSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
    case DataType::kFloat16:
      return 2;
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt8:
      return 1;
    case DataType::kUint8:
      return 1;
    case DataType::kInt32:
      return 4;
    case DataType::kUint32:
      return 4;
    case DataType::kInt64:
      return 8;
    case DataType::kUint64:
      return 8;
  }
  return 0;
}

std::string_view Name(DataType dtype) {
  for (const DataTypeName& entry : kDataTypeNames) {
    if (entry.dtype == dtype) return entry.name;
  }
  return "unknown";
}

std::string_view Name(RedOp op) {
  for (const RedOpName& entry : kRedOpNames) {
    if (entry.op == op) return entry.name;
  }
  return "unknown";
}

bool ParseDataType(std::string_view name, DataType* out) {
  for (const DataTypeName& entry : kDataTypeNames) {
    if (EqualsIgnoreCase(name, entry.name)) {
      *out = entry.dtype;
      return true;
    }
  }
  return false;
}

bool ParseRedOp(std::string_view name, RedOp* out) {
  for (const RedOpName& entry : kRedOpNames) {
    if (EqualsIgnoreCase(name, entry.name)) {
      *out = entry.op;
      return true;
    }
  }
  return false;
}

}  // namespace railyard
