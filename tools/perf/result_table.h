// nccl-tests' output layout, column for column: '#' header lines, one row per size with an
// out-of-place and an in-place result, and the "# Out of bounds" / "# Avg bus bandwidth" footer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace railyard::perf {

// The three '#' lines naming the columns.
std::string FormatColumnHeader();

// The left part of a row: size, count, type, redop, root (-1 when the op has none).
std::string FormatRowPrefix(size_t bytes, size_t count, std::string_view type,
                            std::string_view redop, int root);

// One result: time (us, 2, 1 or 0 decimals by magnitude, as nccl-tests), algbw and busbw (GB/s),
// #wrong (negative: not checked, printed "N/A").
std::string FormatResult(double time_us, double algbw_gbps, double busbw_gbps, int64_t wrong);

// nccl-tests' time column: "%7.2f" below 100 us, "%7.1f" below 10 ms, else "%7.0f".
std::string FormatTime(double time_us);

// "# Out of bounds values : N OK|FAILED", "# Avg bus bandwidth    : X", "#".
std::string FormatFooter(int64_t results_with_errors, double avg_busbw_gbps);

// algbw in GB/s (10^9 bytes/s) for `bytes` per iteration of `seconds`; 0 for a zero time.
double AlgBw(double bytes, double seconds);

}  // namespace railyard::perf
