// nccl-tests 2.19's output, line for line (its common.cu / util.cu): the run's header (version,
// "Collective test starting", the nThread line, "# Using devices" with one line per rank), the
// '#' column header, one row per size with an out-of-place and an in-place result, and the
// footer ("# Out of bounds values", "# Avg bus bandwidth" judged against NCCL_TESTS_MIN_BW,
// "# Collective test concluded").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace railyard::perf {

// What the header says about the run.
struct RunHeader {
  std::string program;  // all_reduce_perf, ...
  int nthreads = 1;
  int ngpus = 1;
  size_t min_bytes = 0;
  size_t max_bytes = 0;
  size_t step_factor = 1;  // > 1: by factor; else step_bytes
  size_t step_bytes = 0;
  int warmup_iters = 0;
  int iters = 0;
  int agg_iters = 1;
  int validation = 1;
  int graph = 0;
  int blocking = 0;  // -z
  int nccl_version = 22809;
};
// One "#  Rank ..." line's facts.
struct RankLine {
  int rank = 0;
  int pid = 0;
  std::string host;  // the rank's node (its daemon's --node_name)
  int device = -1;   // CUDA device, -1: host memory
  std::string what;  // after the PCI id: the device's or memory's description
};

// The version, starting, nThread (and -z) lines, "#", "# Using devices" and the rank lines.
std::string FormatRunHeader(const RunHeader& h, const std::vector<RankLine>& ranks);

// "#" and the three lines naming the columns.
std::string FormatColumnHeader();

// The left part of a row: size, count, type, redop, root (-1 when the op has none).
std::string FormatRowPrefix(size_t bytes, size_t count, std::string_view type,
                            std::string_view redop, int root);

// One result: time (us), algbw and busbw (GB/s), each with 2, 1 or 0 decimals as its column fits
// (nccl-tests' getFloatStr), and #wrong (negative: not checked, printed "N/A").
std::string FormatResult(double time_us, double algbw_gbps, double busbw_gbps, int64_t wrong);

// A value in `width` columns: "%.2f" if it fits, else "%.1f", "%.0f", then an exponent.
std::string FormatFloat(double value, int width);
// The time column (7 wide).
std::string FormatTime(double time_us);

// "# Out of bounds values : N OK|FAILED", "# Avg bus bandwidth    : X [OK|FAILED]" (judged when
// min_bw >= 0: below 90% of it fails), "#", "# Collective test concluded: <program>", "#", "".
std::string FormatFooter(int64_t results_with_errors, double avg_busbw_gbps, double min_bw,
                         std::string_view program);
// True when avg_busbw fails NCCL_TESTS_MIN_BW's check (min_bw < 0: unchecked).
bool BelowMinBw(double avg_busbw_gbps, double min_bw);

// algbw in GB/s (10^9 bytes/s) for `bytes` per iteration of `seconds`; 0 for a zero time.
double AlgBw(double bytes, double seconds);

}  // namespace railyard::perf
