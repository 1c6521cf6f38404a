// Gradient codecs for the wire: what a compressed inter-node step sends instead of float32 values,
// and the error-feedback step that keeps compression from biasing training (see
// docs/compression.md). They know nothing but memory: no collectives, no ranks.
//
// Wire formats (host byte order, like every other payload between daemons of one job):
//   fp16, bf16: n 16-bit values (round-to-nearest-even; |x| > 65504 is +-inf in fp16).
//   int8:B      ceil(n / B) float32 scales, then n int8 values: x ~ q * scale,
//               scale = max|x| / 127 over the block, |error| <= scale / 2 (+ one float32 rounding
//               of q * scale). A block holding NaN or +-inf is sent with a NaN scale and decodes to
//               NaN throughout: the reduced result would be non-finite uncompressed too.
//   topk:R      K = max(1, ceil(R * n)) (index, value) pairs: the K largest |x| (NaN counts as the
//               largest; ties go to the lower index), as K uint32 indices in increasing order, then
//               their K float32 values. The others decode to 0.
//               Indices are 32-bit: n < 2^32 (inter-node steps move chunks, far smaller).
// Decode checks what it is given (a peer's bytes are untrusted input): the exact length, indices
// increasing and in range, scales non-negative or NaN. It never reads or writes out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace railyard::kernels {

enum class CodecKind : uint8_t { kNone, kFp16, kBf16, kInt8, kTopK };

struct Codec {
  CodecKind kind = CodecKind::kNone;
  uint32_t block = 128;     // int8: elements per scale, in [8, 65536]
  double topk_ratio = 0.0;  // topk: the fraction kept, in (0, 1]
};

// "none", "fp16", "bf16", "int8", "int8:B", "topk:R" (R a fraction such as 0.01 or a percentage
// such as 1%). INVALID_ARGUMENT naming the text and the accepted forms otherwise.
absl::StatusOr<Codec> ParseCodec(absl::string_view text);
// The canonical spelling ParseCodec accepts ("int8:128", "topk:0.01").
std::string CodecName(const Codec& codec);

// topk: the number of elements kept for n (0 for n = 0).
size_t TopKCount(const Codec& codec, size_t n);
// The exact bytes Encode writes for n float32 values (4n for none).
size_t EncodedBytes(const Codec& codec, size_t n);
// 4n / EncodedBytes: how many times fewer bytes cross the wire.
double CompressionRatio(const Codec& codec, size_t n);

// Writes EncodedBytes(codec, n) bytes to out and returns that count. For topk, scratch must hold n
// uint32 (nullptr: allocated here).
size_t Encode(const Codec& codec, const float* in, size_t n, uint8_t* out,
              uint32_t* scratch = nullptr);
// out[i] = the decoded value of element i, for i in [0, n). INVALID_ARGUMENT (naming what is
// wrong) when `bytes` is not EncodedBytes(codec, n) or the content is malformed; out is then
// unspecified but nothing outside [out, out + n) is touched.
absl::Status Decode(const Codec& codec, const uint8_t* in, size_t bytes, size_t n, float* out);
// acc[i] += the decoded value of element i: a compressed contribution reduced (SUM) into a
// float32 accumulator without a dense temporary. Same checks as Decode, made before acc changes.
absl::Status DecodeAdd(const Codec& codec, const uint8_t* in, size_t bytes, size_t n, float* acc);

// Error feedback: u = g + residual; writes v = C(u) to out (EncodedBytes bytes, returned) and sets
// residual = u - D(v). So D(v_k) + e_{k+1} = fl(g_k + e_k) holds element by element at every step
// (the subtraction is exact: D(v) is within a factor 2 of u or 0), and over K steps the values
// sent sum to the gradients' sum plus e_1 - e_{K+1} up to the rounding of each g + e. An element
// that decodes non-finite (fp16 overflow, a NaN int8 block) gets residual 0: its result is
// non-finite anyway, and an inf or NaN kept would poison every later step. For topk, scratch as
// in Encode.
size_t EncodeWithFeedback(const Codec& codec, const float* g, float* residual, size_t n,
                          uint8_t* out, uint32_t* scratch = nullptr);

}  // namespace railyard::kernels
