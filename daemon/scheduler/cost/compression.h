// When compression pays (docs/compression.md): the tuner's call for compression=auto. A codec
// cuts an AllReduce's (or a ReduceScatter's) wire bytes by its ratio r but costs encode and decode
// time on the node, so it is worth it only when codec_s(M) < T(M) - T(M / r), with T the tuner's
// best prediction on the communicator's calibrated fabric. Deterministic, like the tuner: every
// daemon of a communicator decides the same from the same inputs.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/kernels/codec.h"
#include "daemon/scheduler/cost/tuner.h"

namespace railyard::scheduler::cost {

// Codec throughput in float32 bytes per second on one core: the encode rates are kernels_bench's
// Codec benchmarks on the reference machine (docs/compression.md); the decode rates are not
// measured there and are set near the encode rates.
struct CodecRates {
  double encode_bytes_per_s = 0;
  double decode_bytes_per_s = 0;
};
CodecRates DefaultCodecRates(const kernels::Codec& codec);

// Per node, the compressed AllReduce (compressed.h) encodes every element once (its own shard's
// result or its contribution to another's) and decodes about 2 (N - 1) / N + 1 / N of them; the
// compressed ReduceScatter (gather false) encodes and decodes (N - 1) / N of them.
// message_bytes: the float32 bytes of one rank's input.
double CodecSeconds(const kernels::Codec& codec, double message_bytes, int nnodes,
                    bool gather = true);

struct CompressionChoice {
  kernels::Codec codec;      // none: run exact
  double exact_s = -1;       // T(M): the tuner's best uncompressed prediction
  double compressed_s = -1;  // T(M / r) + codec_s of the best codec considered
  double codec_s = 0;
  std::string considered;  // that codec's name
  std::string reason;
};

// The compressed path's own fixed cost per operation, beyond T(M / r) and the codec: its second
// exchange and the encode/decode steps' hand-offs (measured: int8 against exact at 4 KiB).
inline constexpr double kCompressedFixedS = 100e-6;
// Compression runs only when predicted at least this much faster than exact: the model's
// per-size error (railctl calibrate: up to ~15 % at 256 KiB here) must not turn a predicted gain
// into a loss.
inline constexpr double kCompressionMargin = 0.9;

// The cheapest of `candidates` (compressed_s = T(M / r) + codec_s + kCompressedFixedS) when it is
// below kCompressionMargin x exact, else none. shape: an AllReduce or a ReduceScatter.
absl::StatusOr<CompressionChoice> ChooseCompression(Tuner& tuner, const OpShape& shape, int nnodes,
                                                    int nranks,
                                                    const std::vector<kernels::Codec>& candidates);
// What compression=auto considers: int8 (the best ratio of the codecs with a per-element bound;
// bf16 and fp16 save half of what int8 saves for about the same CPU per byte on the wire, and
// top-k is no default: its error depends on the data).
std::vector<kernels::Codec> AutoCandidates();

}  // namespace railyard::scheduler::cost
