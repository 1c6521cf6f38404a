#include "tools/perf/result_table.h"

#include <cstdio>

#include "absl/strings/str_format.h"

namespace railyard::perf {

std::string FormatRunHeader(const RunHeader& h, const std::vector<RankLine>& ranks) {
  std::string out = absl::StrFormat(
      "# nccl-tests version 2.19.0 nccl-headers=%d nccl-library=%d\n"
      "# Collective test starting: %s\n"
      "# nThread %d nGpus %d minBytes %d maxBytes %d step: %d(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: %d unalign: 0\n",
      h.nccl_version, h.nccl_version, h.program, h.nthreads, h.ngpus, h.min_bytes, h.max_bytes,
      h.step_factor > 1 ? h.step_factor : h.step_bytes, h.step_factor > 1 ? "factor" : "bytes",
      h.warmup_iters, h.iters, h.agg_iters, h.validation, h.graph);
  if (h.blocking == 1) {
    out += "# Blocking Enabled: wait and barrier after each inner iteration (-m) \n";
  }
  out += "#\n# Using devices\n";
  for (const RankLine& r : ranks) {
    absl::StrAppendFormat(&out,
                          "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n",
                          r.rank, 0, r.pid, r.host, r.device, 0, 0, 0, r.what);
  }
  return out;
}

std::string FormatColumnHeader() {
  std::string out = "#\n";
  absl::StrAppendFormat(
      &out,
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
      "          \n",
      "", "", "", "", "");
  absl::StrAppendFormat(&out,
                        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n",
                        "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                        "#wrong", "time", "algbw", "busbw", "#wrong", "");
  absl::StrAppendFormat(
      &out, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n", "(B)",
      "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "");
  return out;
}

std::string FormatRowPrefix(size_t bytes, size_t count, std::string_view type,
                            std::string_view redop, int root) {
  return absl::StrFormat("%12d  %12d  %8s  %6s  %6d", bytes, count, type, redop, root);
}

std::string FormatFloat(double value, int width) {
  char buf[64];
  for (const char* fmt : {"%*.2f", "%*.1f", "%*.0f"}) {
    if (std::snprintf(buf, sizeof(buf), fmt, width, value) <= width) return buf;
  }
  std::snprintf(buf, sizeof(buf), width >= 7 ? "%*.1e" : "%*.0e", width, value);
  return buf;
}

std::string FormatTime(double time_us) { return FormatFloat(time_us, 7); }

std::string FormatResult(double time_us, double algbw_gbps, double busbw_gbps, int64_t wrong) {
  if (wrong < 0) {
    return absl::StrFormat("  %7s  %6s  %6s    N/A", FormatTime(time_us),
                           FormatFloat(algbw_gbps, 6), FormatFloat(busbw_gbps, 6));
  }
  return absl::StrFormat("  %7s  %6s  %6s  %6g", FormatTime(time_us), FormatFloat(algbw_gbps, 6),
                         FormatFloat(busbw_gbps, 6), static_cast<double>(wrong));
}

bool BelowMinBw(double avg_busbw_gbps, double min_bw) {
  return min_bw >= 0 && avg_busbw_gbps < min_bw * 0.9;
}

std::string FormatFooter(int64_t results_with_errors, double avg_busbw_gbps, double min_bw,
                         std::string_view program) {
  return absl::StrFormat(
      "# %-20s : %d %s\n# %-20s : %g %s\n#\n# Collective test concluded: %s\n#\n\n",
      "Out of bounds values", results_with_errors, results_with_errors != 0 ? "FAILED" : "OK",
      "Avg bus bandwidth", avg_busbw_gbps,
      min_bw < 0 ? "" : (BelowMinBw(avg_busbw_gbps, min_bw) ? "FAILED" : "OK"), program);
}

double AlgBw(double bytes, double seconds) { return seconds > 0 ? bytes / 1.0e9 / seconds : 0.0; }

}  // namespace railyard::perf
