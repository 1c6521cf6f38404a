#include "daemon/scheduler/cost/compression.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace railyard::scheduler::cost {

CodecRates DefaultCodecRates(const kernels::Codec& codec) {
  constexpr double kG = 1e9;
  switch (codec.kind) {
    case kernels::CodecKind::kFp16:
      return {4.3 * kG, 4.0 * kG};
    case kernels::CodecKind::kBf16:
      return {8.2 * kG, 8.0 * kG};
    case kernels::CodecKind::kInt8:
      return {2.7 * kG, 3.0 * kG};
    case kernels::CodecKind::kTopK:
      return {0.43 * kG, 4.0 * kG};
    case kernels::CodecKind::kNone:
      break;
  }
  return {0, 0};
}

double CodecSeconds(const kernels::Codec& codec, double message_bytes, int nnodes, bool gather) {
  const CodecRates r = DefaultCodecRates(codec);
  if (r.encode_bytes_per_s <= 0) return 0;
  const double n = nnodes > 1 ? nnodes : 2;
  const double encoded = gather ? message_bytes : message_bytes * (n - 1) / n;
  const double decoded = message_bytes * (gather ? 2 * (n - 1) / n + 1 / n : (n - 1) / n);
  return encoded / r.encode_bytes_per_s + decoded / r.decode_bytes_per_s;
}

std::vector<kernels::Codec> AutoCandidates() {
  kernels::Codec int8;
  int8.kind = kernels::CodecKind::kInt8;
  return {int8};
}

absl::StatusOr<CompressionChoice> ChooseCompression(Tuner& tuner, const OpShape& shape, int nnodes,
                                                    int nranks,
                                                    const std::vector<kernels::Codec>& candidates) {
  absl::StatusOr<std::shared_ptr<const Choice>> exact = tuner.Choose(shape);
  if (!exact.ok()) return exact.status();
  CompressionChoice out;
  out.exact_s = (*exact)->predicted_s;
  // Codecs work on float32 (16-bit data is widened first): m is what they read and write, and
  // their ratio against the data's own bytes is smaller by 4 / the element size.
  const bool gather = shape.op != OpKind::kReduceScatter;
  const double m = static_cast<double>(shape.count) * 4 *
                   (gather ? 1.0 : static_cast<double>(std::max(nranks, 1)));
  const double narrow = 4.0 / static_cast<double>(kernels::ElementSize(shape.dtype));
  for (const kernels::Codec& c : candidates) {
    const size_t n = static_cast<size_t>(std::max<uint64_t>(shape.count, 1));
    const double ratio = kernels::CompressionRatio(c, n) / narrow;
    OpShape small = shape;
    small.count = static_cast<uint64_t>(std::ceil(static_cast<double>(shape.count) / ratio));
    absl::StatusOr<std::shared_ptr<const Choice>> wire = tuner.Choose(small);
    if (!wire.ok()) return wire.status();
    const double codec_s = CodecSeconds(c, m, nnodes, gather);
    const double t = (*wire)->predicted_s + codec_s + kCompressedFixedS;
    if (out.compressed_s < 0 || t < out.compressed_s) {
      out.compressed_s = t;
      out.codec_s = codec_s;
      out.considered = kernels::CodecName(c);
      if (t < kCompressionMargin * out.exact_s) out.codec = c;
    }
  }
  if (out.codec.kind != kernels::CodecKind::kNone) {
    out.reason = absl::StrFormat(
        "compressed %s: %.3g s predicted (%.3g s of it encoding and decoding) against %.3g s exact",
        out.considered, out.compressed_s, out.codec_s, out.exact_s);
  } else {
    out.reason = absl::StrFormat(
        "exact: %.3g s predicted; the best codec, %s, would take %.3g s (%.3g s of it encoding "
        "and decoding), not 10%% less",
        out.exact_s, out.considered, out.compressed_s, out.codec_s);
  }
  return out;
}

}  // namespace railyard::scheduler::cost
