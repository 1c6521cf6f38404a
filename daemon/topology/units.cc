#include "daemon/topology/units.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace railyard::topology {
namespace {

struct Unit {
  const char* name;
  double factor;
};

// Splits "12.5 GB/s" into 12.5 and "GB/s". False when no number leads the text.
bool SplitNumber(absl::string_view text, double* value, std::string* unit) {
  const std::string s(absl::StripAsciiWhitespace(text));
  if (s.empty()) return false;
  char* end = nullptr;
  *value = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(*value)) return false;
  *unit = std::string(absl::StripAsciiWhitespace(absl::string_view(end)));
  return true;
}

absl::StatusOr<double> Parse(absl::string_view text, absl::string_view what,
                             const std::vector<Unit>& units, bool bare_ok) {
  double value = 0;
  std::string unit;
  std::vector<std::string> names;
  names.reserve(units.size());
  for (const Unit& u : units) names.emplace_back(u.name);
  const std::string accepted = absl::StrJoin(names, ", ");
  if (!SplitNumber(text, &value, &unit)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ", what, " '", text, "': expected a number and a unit (", accepted, ")"));
  }
  if (value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad ", what, " '", text, "': negative"));
  }
  if (unit.empty() && bare_ok) return value;
  for (const Unit& u : units) {
    if (unit != u.name) continue;
    // A finite number times a unit can overflow ("1e300 TB/s"): an infinite link would cost
    // nothing in the cost model.
    if (!std::isfinite(value * u.factor)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad ", what, " '", text, "': too large (overflows a double)"));
    }
    return value * u.factor;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bad ", what, " '", text, "': unknown unit '", unit, "' (use ", accepted, ")"));
}

std::string Format(double value, const std::vector<Unit>& units_desc) {
  // units_desc from the largest down; the first whose factor fits.
  for (const Unit& u : units_desc) {
    if (std::fabs(value) >= u.factor || &u == &units_desc.back()) {
      const double v = value / u.factor;
      return absl::StrFormat("%.*f %s", std::fabs(v) >= 10 ? 1 : 3, v, u.name);
    }
  }
  return absl::StrCat(value);
}

}  // namespace

absl::StatusOr<double> ParseBytes(absl::string_view text) {
  static const std::vector<Unit> kUnits = {
      {"B", 1},           {"KB", 1e3},           {"MB", 1e6},
      {"GB", 1e9},        {"TB", 1e12},          {"KiB", 1024.0},
      {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  return Parse(text, "size", kUnits, /*bare_ok=*/true);
}

absl::StatusOr<double> ParseDuration(absl::string_view text) {
  static const std::vector<Unit> kUnits = {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1}};
  return Parse(text, "duration", kUnits, /*bare_ok=*/true);
}

absl::StatusOr<double> ParseBandwidth(absl::string_view text) {
  static const std::vector<Unit> kUnits = {
      {"B/s", 1},           {"KB/s", 1e3},       {"MB/s", 1e6},        {"GB/s", 1e9},
      {"TB/s", 1e12},       {"KiB/s", 1024.0},   {"MiB/s", 1048576.0}, {"GiB/s", 1073741824.0},
      {"bit/s", 1.0 / 8},   {"Kbit/s", 1e3 / 8}, {"Mbit/s", 1e6 / 8},  {"Gbit/s", 1e9 / 8},
      {"Tbit/s", 1e12 / 8}, {"Gbps", 1e9 / 8},   {"Mbps", 1e6 / 8}};
  absl::StatusOr<double> v = Parse(text, "bandwidth", kUnits, /*bare_ok=*/true);
  if (v.ok() && *v <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad bandwidth '", text, "': must be > 0"));
  }
  return v;
}

std::string FormatBytes(double bytes) {
  static const std::vector<Unit> kDesc = {
      {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}};
  return Format(bytes, kDesc);
}

std::string FormatDuration(double seconds) {
  static const std::vector<Unit> kDesc = {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  return Format(seconds, kDesc);
}

std::string FormatBandwidth(double bytes_per_s) {
  static const std::vector<Unit> kDesc = {
      {"TB/s", 1e12}, {"GB/s", 1e9}, {"MB/s", 1e6}, {"KB/s", 1e3}, {"B/s", 1}};
  return Format(bytes_per_s, kDesc);
}

}  // namespace railyard::topology
