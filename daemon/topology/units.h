// Quantities with units, as operators type them: sizes ("1MB" = 10^6 bytes, "1MiB" = 2^20),
// durations ("3us"), bandwidths ("50GB/s" = 5e10 bytes/s, "400Gbit/s" = 5e10 bytes/s). Used by
// railctl's flags and the topology files. Errors are INVALID_ARGUMENT naming the text and the
// accepted units.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace railyard::topology {

// B, KB, MB, GB, TB (powers of 10), KiB, MiB, GiB, TiB; a bare number is bytes. Non-negative.
absl::StatusOr<double> ParseBytes(absl::string_view text);
// ns, us, ms, s; a bare number is seconds. Non-negative.
absl::StatusOr<double> ParseDuration(absl::string_view text);
// Bytes per second: B/s, KB/s, MB/s, GB/s, TB/s, KiB/s..GiB/s, and bits: bit/s, Kbit/s,
// Mbit/s, Gbit/s, Tbit/s (also Gbps). A bare number is bytes/s. Positive.
absl::StatusOr<double> ParseBandwidth(absl::string_view text);

// Human forms for output: "1.00 MB", "39.7 us", "50.0 GB/s" (powers of 10).
std::string FormatBytes(double bytes);
std::string FormatDuration(double seconds);
std::string FormatBandwidth(double bytes_per_s);

}  // namespace railyard::topology
