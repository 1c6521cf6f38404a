#include "daemon/kernels/codec.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/kernels/half.h"

namespace railyard::kernels {
namespace {

using internal::BFloat16BitsToFloat;
using internal::FloatToBFloat16Bits;
using internal::FloatToHalfBits;
using internal::HalfBitsToFloat;

constexpr uint32_t kMinBlock = 8;
constexpr uint32_t kMaxBlock = 65536;
// Values go through small stack arrays so that the loops vectorise on buffers of any alignment
// (the wire staging buffers promise none).
constexpr size_t kTile = 256;

size_t Blocks(const Codec& c, size_t n) { return (n + c.block - 1) / c.block; }

// Round to nearest even for |x| <= 2^22 with plain float adds (vectorises without SSE4.1).
inline float RoundSmall(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (x + kMagic) - kMagic;
}

inline bool Finite(float x) { return std::fabs(x) <= FLT_MAX; }  // false for NaN and +-inf

// --- fp16 / bf16 ---

template <uint16_t (*ToBits)(float)>
void EncodeHalf(const float* in, size_t n, uint8_t* out) {
  uint16_t tile[kTile];
  for (size_t i = 0; i < n; i += kTile) {
    const size_t len = std::min(kTile, n - i);
    for (size_t j = 0; j < len; ++j) tile[j] = ToBits(in[i + j]);
    std::memcpy(out + 2 * i, tile, 2 * len);
  }
}

// op(i, decoded value) for every element, in order.
template <float (*FromBits)(uint16_t), typename Op>
void ForEachHalf(const uint8_t* in, size_t n, Op op) {
  uint16_t tile[kTile];
  for (size_t i = 0; i < n; i += kTile) {
    const size_t len = std::min(kTile, n - i);
    std::memcpy(tile, in + 2 * i, 2 * len);
    for (size_t j = 0; j < len; ++j) op(i + j, FromBits(tile[j]));
  }
}

// --- int8 blocks ---

void EncodeInt8(const Codec& c, const float* in, size_t n, uint8_t* out) {
  const size_t blocks = Blocks(c, n);
  uint8_t* q_out = out + 4 * blocks;
  int8_t tile[kTile];
  for (size_t b = 0; b < blocks; ++b) {
    const float* x = in + b * c.block;
    const size_t len = std::min<size_t>(c.block, n - b * c.block);
    float m = 0.0f;
    uint32_t bad = 0;
    for (size_t i = 0; i < len; ++i) {
      const float a = std::fabs(x[i]);
      m = a > m ? a : m;
      bad |= static_cast<uint32_t>(!(a <= FLT_MAX));
    }
    const float scale = bad != 0 ? std::numeric_limits<float>::quiet_NaN() : m / 127.0f;
    const float inv = (bad == 0 && m > 0.0f) ? 127.0f / m : 0.0f;
    std::memcpy(out + 4 * b, &scale, 4);
    if (bad != 0) {  // NaN * q decodes NaN; x * 0 would be NaN here and NaN has no int8
      std::memset(q_out + b * c.block, 0, len);
      continue;
    }
    for (size_t i = 0; i < len; i += kTile) {
      const size_t t = std::min(kTile, len - i);
      for (size_t j = 0; j < t; ++j) {
        float r = RoundSmall(x[i + j] * inv);
        r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
        tile[j] = static_cast<int8_t>(static_cast<int32_t>(r));
      }
      std::memcpy(q_out + b * c.block + i, tile, t);
    }
  }
}

absl::Status CheckInt8(const Codec& c, const uint8_t* in, size_t n) {
  const size_t blocks = Blocks(c, n);
  for (size_t b = 0; b < blocks; ++b) {
    float s;
    std::memcpy(&s, in + 4 * b, 4);
    if (!std::isnan(s) && !(s >= 0.0f && s <= FLT_MAX)) {
      return absl::InvalidArgumentError(absl::StrCat("int8 codec: the scale of block ", b, " is ",
                                                     s, ": not a finite non-negative number"));
    }
  }
  return absl::OkStatus();
}

template <typename Op>
void ForEachInt8(const Codec& c, const uint8_t* in, size_t n, Op op) {
  const size_t blocks = Blocks(c, n);
  const uint8_t* q_in = in + 4 * blocks;
  int8_t tile[kTile];
  for (size_t b = 0; b < blocks; ++b) {
    float scale;
    std::memcpy(&scale, in + 4 * b, 4);
    const size_t base = b * c.block;
    const size_t len = std::min<size_t>(c.block, n - base);
    for (size_t i = 0; i < len; i += kTile) {
      const size_t t = std::min(kTile, len - i);
      std::memcpy(tile, q_in + base + i, t);
      for (size_t j = 0; j < t; ++j) op(base + i + j, static_cast<float>(tile[j]) * scale);
    }
  }
}

// --- top-k ---

// NaN > +-inf > every finite magnitude: the bits of |x| order like the values for non-negative
// floats, and NaNs sit above infinity.
inline uint32_t MagnitudeKey(float x) { return std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu; }

void EncodeTopK(const Codec& c, const float* in, size_t n, uint8_t* out, uint32_t* scratch) {
  const size_t k = TopKCount(c, n);
  if (k == 0) return;
  std::unique_ptr<uint32_t[]> owned;
  if (scratch == nullptr) {
    owned = std::make_unique<uint32_t[]>(n);
    scratch = owned.get();
  }
  for (size_t i = 0; i < n; ++i) scratch[i] = MagnitudeKey(in[i]);
  // The k-th largest key: everything above it is kept, then ties by increasing index.
  std::nth_element(scratch, scratch + (n - k), scratch + n);
  const uint32_t threshold = scratch[n - k];
  size_t above = 0;
  for (size_t i = 0; i < n; ++i) above += MagnitudeKey(in[i]) > threshold ? 1 : 0;
  size_t ties = k - above;
  uint8_t* idx_out = out;
  uint8_t* val_out = out + 4 * k;
  size_t taken = 0;
  for (size_t i = 0; i < n && taken < k; ++i) {
    const uint32_t key = MagnitudeKey(in[i]);
    bool take = key > threshold;
    if (!take && key == threshold && ties > 0) {
      take = true;
      --ties;
    }
    if (!take) continue;
    const uint32_t index = static_cast<uint32_t>(i);
    std::memcpy(idx_out + 4 * taken, &index, 4);
    std::memcpy(val_out + 4 * taken, &in[i], 4);
    ++taken;
  }
}

absl::Status CheckTopK(const uint8_t* in, size_t k, size_t n) {
  uint32_t prev = 0;
  for (size_t j = 0; j < k; ++j) {
    uint32_t index;
    std::memcpy(&index, in + 4 * j, 4);
    if (index >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("topk codec: index ", j, " is ", index, ", past the ", n, " elements"));
    }
    if (j > 0 && index <= prev) {
      return absl::InvalidArgumentError(absl::StrCat("topk codec: index ", j, " (", index,
                                                     ") does not follow index ", j - 1, " (", prev,
                                                     "): indices must increase"));
    }
    prev = index;
  }
  return absl::OkStatus();
}

template <typename Op>
void ForEachTopK(const uint8_t* in, size_t k, Op op) {
  for (size_t j = 0; j < k; ++j) {
    uint32_t index;
    float value;
    std::memcpy(&index, in + 4 * j, 4);
    std::memcpy(&value, in + 4 * k + 4 * j, 4);
    op(index, value);
  }
}

// --- shared checks ---

absl::Status CheckLength(const Codec& c, size_t bytes, size_t n) {
  const size_t want = EncodedBytes(c, n);
  if (bytes != want) {
    return absl::InvalidArgumentError(absl::StrCat(CodecName(c), " codec: ", bytes, " bytes for ",
                                                   n, " elements, which take ", want));
  }
  return absl::OkStatus();
}

absl::Status CheckContent(const Codec& c, const uint8_t* in, size_t n) {
  switch (c.kind) {
    case CodecKind::kInt8:
      return CheckInt8(c, in, n);
    case CodecKind::kTopK:
      return CheckTopK(in, TopKCount(c, n), n);
    default:
      return absl::OkStatus();
  }
}

// op(i, decoded value) for every element the encoding carries (all of them but topk's zeros).
template <typename Op>
void ForEachDecoded(const Codec& c, const uint8_t* in, size_t n, Op op) {
  switch (c.kind) {
    case CodecKind::kNone: {
      float tile[kTile];
      for (size_t i = 0; i < n; i += kTile) {
        const size_t len = std::min(kTile, n - i);
        std::memcpy(tile, in + 4 * i, 4 * len);
        for (size_t j = 0; j < len; ++j) op(i + j, tile[j]);
      }
      return;
    }
    case CodecKind::kFp16:
      return ForEachHalf<HalfBitsToFloat>(in, n, op);
    case CodecKind::kBf16:
      return ForEachHalf<BFloat16BitsToFloat>(in, n, op);
    case CodecKind::kInt8:
      return ForEachInt8(c, in, n, op);
    case CodecKind::kTopK:
      return ForEachTopK(in, TopKCount(c, n), op);
  }
}

}  // namespace

absl::StatusOr<Codec> ParseCodec(absl::string_view text) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compression '", text.substr(0, 64), "' ", why,
        " (accepted: none, fp16, bf16, int8, int8:BLOCK with BLOCK in [", kMinBlock, ", ",
        kMaxBlock, "], topk:RATIO with RATIO in (0, 1] or a percentage such as 1%)"));
  };
  Codec c;
  if (text == "none") return c;
  if (text == "fp16") {
    c.kind = CodecKind::kFp16;
    return c;
  }
  if (text == "bf16") {
    c.kind = CodecKind::kBf16;
    return c;
  }
  if (text == "int8") {
    c.kind = CodecKind::kInt8;
    return c;
  }
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "int8:")) {
    c.kind = CodecKind::kInt8;
    if (!absl::SimpleAtoi(rest, &c.block) || c.block < kMinBlock || c.block > kMaxBlock) {
      return bad("has a block size that is not an integer in range");
    }
    return c;
  }
  if (absl::ConsumePrefix(&rest, "topk:")) {
    c.kind = CodecKind::kTopK;
    const bool percent = absl::ConsumeSuffix(&rest, "%");
    double ratio = 0;
    if (!absl::SimpleAtod(rest, &ratio) || !std::isfinite(ratio)) {
      return bad("has a ratio that is not a number");
    }
    if (percent) ratio /= 100.0;
    if (!(ratio > 0.0 && ratio <= 1.0)) return bad("has a ratio outside (0, 1]");
    c.topk_ratio = ratio;
    return c;
  }
  return bad("is not a codec");
}

std::string CodecName(const Codec& c) {
  switch (c.kind) {
    case CodecKind::kNone:
      return "none";
    case CodecKind::kFp16:
      return "fp16";
    case CodecKind::kBf16:
      return "bf16";
    case CodecKind::kInt8:
      return c.block == 128 ? "int8" : absl::StrCat("int8:", c.block);
    case CodecKind::kTopK:
      return absl::StrCat("topk:", c.topk_ratio);
  }
  return "unknown";
}

size_t TopKCount(const Codec& c, size_t n) {
  if (n == 0) return 0;
  const double exact = c.topk_ratio * static_cast<double>(n);
  const double nearest = std::round(exact);
  // 0.01 * 300 is 3.0000000000000004 in binary: a product within rounding of an integer is it.
  const double k =
      std::fabs(exact - nearest) <= 1e-9 * std::max(1.0, exact) ? nearest : std::ceil(exact);
  return std::clamp<size_t>(static_cast<size_t>(k), 1, n);
}

size_t EncodedBytes(const Codec& c, size_t n) {
  switch (c.kind) {
    case CodecKind::kNone:
      return 4 * n;
    case CodecKind::kFp16:
    case CodecKind::kBf16:
      return 2 * n;
    case CodecKind::kInt8:
      return 4 * Blocks(c, n) + n;
    case CodecKind::kTopK:
      return 8 * TopKCount(c, n);
  }
  return 4 * n;
}

double CompressionRatio(const Codec& c, size_t n) {
  const size_t bytes = EncodedBytes(c, n);
  return bytes == 0 ? 1.0 : static_cast<double>(4 * n) / static_cast<double>(bytes);
}

size_t Encode(const Codec& c, const float* in, size_t n, uint8_t* out, uint32_t* scratch) {
  switch (c.kind) {
    case CodecKind::kNone:
      if (n > 0) std::memcpy(out, in, 4 * n);
      break;
    case CodecKind::kFp16:
      EncodeHalf<FloatToHalfBits>(in, n, out);
      break;
    case CodecKind::kBf16:
      EncodeHalf<FloatToBFloat16Bits>(in, n, out);
      break;
    case CodecKind::kInt8:
      EncodeInt8(c, in, n, out);
      break;
    case CodecKind::kTopK:
      EncodeTopK(c, in, n, out, scratch);
      break;
  }
  return EncodedBytes(c, n);
}

absl::Status Decode(const Codec& c, const uint8_t* in, size_t bytes, size_t n, float* out) {
  if (absl::Status s = CheckLength(c, bytes, n); !s.ok()) return s;
  if (absl::Status s = CheckContent(c, in, n); !s.ok()) return s;
  if (c.kind == CodecKind::kTopK) std::fill(out, out + n, 0.0f);
  ForEachDecoded(c, in, n, [out](size_t i, float v) { out[i] = v; });
  return absl::OkStatus();
}

absl::Status DecodeAdd(const Codec& c, const uint8_t* in, size_t bytes, size_t n, float* acc) {
  if (absl::Status s = CheckLength(c, bytes, n); !s.ok()) return s;
  if (absl::Status s = CheckContent(c, in, n); !s.ok()) return s;
  ForEachDecoded(c, in, n, [acc](size_t i, float v) { acc[i] += v; });
  return absl::OkStatus();
}

size_t EncodeWithFeedback(const Codec& c, const float* g, float* residual, size_t n, uint8_t* out,
                          uint32_t* scratch) {
  for (size_t i = 0; i < n; ++i) residual[i] = g[i] + residual[i];  // u, in place
  const size_t bytes = Encode(c, residual, n, out, scratch);
  // residual = u - D(v); our own encoding needs no checks.
  ForEachDecoded(c, out, n, [residual](size_t i, float d) {
    residual[i] = Finite(d) ? residual[i] - d : 0.0f;
  });
  return bytes;
}

}  // namespace railyard::kernels
