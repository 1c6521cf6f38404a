#include "client/nccl/nccl_convert.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace railyard::nccl {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {  // round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (abs < 0x38800000u) {                                               // subnormal half (or zero)
    const float magic = 0.5f;
    float a;
    std::memcpy(&a, &abs, 4);
    a += magic;
    uint32_t r;
    std::memcpy(&r, &a, 4);
    return static_cast<uint16_t>(sign | (r - 0x3f000000u));
  }
  const uint32_t mant_odd = (abs >> 13) & 1u;
  const uint32_t r = abs + 0xc8000fffu + mant_odd;  // rebias exponent and round
  return static_cast<uint16_t>(sign | (r >> 13));
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

template <typename T>
void ScaleAs(void* data, size_t n, const void* scalar) {
  T s;
  std::memcpy(&s, scalar, sizeof(T));
  T* p = static_cast<T*>(data);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] * s);
}

template <float (*To)(uint16_t), uint16_t (*From)(float)>
void Scale16(void* data, size_t n, const void* scalar) {
  uint16_t raw;
  std::memcpy(&raw, scalar, 2);
  const float s = To(raw);
  uint16_t* p = static_cast<uint16_t*>(data);
  for (size_t i = 0; i < n; ++i) p[i] = From(To(p[i]) * s);
}

}  // namespace

ncclResult_t ToDataType(ncclDataType_t t, DataType* out, std::string* why) {
  switch (t) {
    case ncclInt8:
      *out = DataType::kInt8;
      return ncclSuccess;
    case ncclUint8:
      *out = DataType::kUint8;
      return ncclSuccess;
    case ncclInt32:
      *out = DataType::kInt32;
      return ncclSuccess;
    case ncclUint32:
      *out = DataType::kUint32;
      return ncclSuccess;
    case ncclInt64:
      *out = DataType::kInt64;
      return ncclSuccess;
    case ncclUint64:
      *out = DataType::kUint64;
      return ncclSuccess;
    case ncclFloat16:
      *out = DataType::kFloat16;
      return ncclSuccess;
    case ncclFloat32:
      *out = DataType::kFloat32;
      return ncclSuccess;
    case ncclFloat64:
      *out = DataType::kFloat64;
      return ncclSuccess;
    case ncclBfloat16:
      *out = DataType::kBFloat16;
      return ncclSuccess;
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      *why = absl::StrCat("datatype ", static_cast<int>(t),
                          " (float8) is not supported by railyard: it has no float8 kernels");
      return ncclInvalidUsage;
    default:
      *why = absl::StrCat("invalid datatype ", static_cast<int>(t));
      return ncclInvalidArgument;
  }
}

bool ToRedOp(ncclRedOp_t op, RedOp* out) {
  switch (op) {
    case ncclSum:
      *out = RedOp::kSum;
      return true;
    case ncclProd:
      *out = RedOp::kProd;
      return true;
    case ncclMax:
      *out = RedOp::kMax;
      return true;
    case ncclMin:
      *out = RedOp::kMin;
      return true;
    case ncclAvg:
      *out = RedOp::kAvg;
      return true;
    default:
      return false;
  }
}

size_t ElementBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

ncclResult_t ResultOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return ncclSuccess;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return ncclInvalidArgument;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kAlreadyExists:
      return ncclInvalidUsage;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return ncclRemoteError;
    case absl::StatusCode::kResourceExhausted:
      return ncclSystemError;
    default:
      return ncclInternalError;
  }
}

void Scale(void* data, size_t n, ncclDataType_t t, const void* scalar) {
  switch (t) {
    case ncclInt8:
      return ScaleAs<int8_t>(data, n, scalar);
    case ncclUint8:
      return ScaleAs<uint8_t>(data, n, scalar);
    case ncclInt32:
      return ScaleAs<int32_t>(data, n, scalar);
    case ncclUint32:
      return ScaleAs<uint32_t>(data, n, scalar);
    case ncclInt64:
      return ScaleAs<int64_t>(data, n, scalar);
    case ncclUint64:
      return ScaleAs<uint64_t>(data, n, scalar);
    case ncclFloat32:
      return ScaleAs<float>(data, n, scalar);
    case ncclFloat64:
      return ScaleAs<double>(data, n, scalar);
    case ncclFloat16:
      return Scale16<HalfToFloat, FloatToHalf>(data, n, scalar);
    case ncclBfloat16:
      return Scale16<Bf16ToFloat, FloatToBf16>(data, n, scalar);
    default:
      return;
  }
}

const char* ErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

}  // namespace railyard::nccl
