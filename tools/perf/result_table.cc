#include "tools/perf/result_table.h"

#include "absl/strings/str_format.h"

namespace railyard::perf {

std::string FormatColumnHeader() {
  std::string out;
  absl::StrAppendFormat(
      &out,
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
      "          \n",
      "", "", "", "", "");
  absl::StrAppendFormat(&out, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n",
                        "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                        "#wrong", "time", "algbw", "busbw", "#wrong");
  absl::StrAppendFormat(
      &out, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
      "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  return out;
}

std::string FormatRowPrefix(size_t bytes, size_t count, std::string_view type,
                            std::string_view redop, int root) {
  return absl::StrFormat("%12d  %12d  %8s  %6s  %6d", bytes, count, type, redop, root);
}

std::string FormatTime(double time_us) {
  if (time_us >= 10000.0) return absl::StrFormat("%7.0f", time_us);
  if (time_us >= 100.0) return absl::StrFormat("%7.1f", time_us);
  return absl::StrFormat("%7.2f", time_us);
}

std::string FormatResult(double time_us, double algbw_gbps, double busbw_gbps, int64_t wrong) {
  if (wrong < 0) {
    return absl::StrFormat("  %7s  %6.2f  %6.2f  %5s", FormatTime(time_us), algbw_gbps, busbw_gbps,
                           "N/A");
  }
  return absl::StrFormat("  %7s  %6.2f  %6.2f  %5d", FormatTime(time_us), algbw_gbps, busbw_gbps,
                         wrong);
}

std::string FormatFooter(int64_t results_with_errors, double avg_busbw_gbps) {
  return absl::StrFormat("# Out of bounds values : %d %s\n# Avg bus bandwidth    : %g \n#\n",
                         results_with_errors, results_with_errors != 0 ? "FAILED" : "OK",
                         avg_busbw_gbps);
}

double AlgBw(double bytes, double seconds) { return seconds > 0 ? bytes / 1.0e9 / seconds : 0.0; }

}  // namespace railyard::perf
