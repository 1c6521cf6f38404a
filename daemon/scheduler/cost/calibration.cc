#include "daemon/scheduler/cost/calibration.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace railyard::scheduler::cost {

Calibration Calibration::Defaults() {
  Calibration c;
  c.intra = {5e-6, 4e9};
  // Between daemons over lo with the rails on cubic (docs/data-plane.md, "Chunk size across
  // daemons"): railctl calibrate fits 2.5-3.1 GB/s, and an 8 B AllReduce takes ~20 us. Until
  // 2026-12 this was 60 us and 1 GB/s, measured with the rails on BBR.
  c.inter = {10e-6, 3e9};
  c.overhead_s = 5e-6;
  // A collective's cost over the session rings beyond its schedule: 2.4 us submission to
  // completion for one rank on one node, 5 us for two. Between two daemons an 8 B AllReduce
  // takes 22-35 us, which the link and CPU figures here already predict (25 us). It was 300
  // us, the gRPC Submit and stream completion of before the rings, and put every prediction
  // (railctl explain, the model metric) that much above what operations take.
  c.op_overhead_s = 5e-6;
  // What a message and a reduced byte cost a daemon there, unhidden: 64 KiB chunks against
  // 256 KiB ones, recursive doubling against the tree (same doc).
  c.message_cpu_s = 5e-6;
  c.reduce_bytes_per_s = 8e9;
  c.source = "default";
  return c;
}

namespace {

// An int field of the file: absent is 0; anything but an integer in int's range is an error.
// (nlohmann's get<int>() of 1e305 is undefined behaviour, of 4.5 silently 4.)
absl::StatusOr<int> IntField(const nlohmann::json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end()) return 0;
  const nlohmann::json& v = *it;
  if (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t{INT_MAX}) {
    return static_cast<int>(v.get<uint64_t>());
  }
  if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= INT_MIN &&
      v.get<int64_t>() <= INT_MAX) {
    return static_cast<int>(v.get<int64_t>());
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d >= INT_MIN && d <= INT_MAX && d == std::trunc(d)) return static_cast<int>(d);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "calibration: ", name, " = ", v.dump().substr(0, 32), " is not an integer in [-2^31, 2^31)"));
}

}  // namespace

absl::Status Validate(const Calibration& c) {
  const struct {
    const char* name;
    double value;
    bool positive;
  } fields[] = {{"intra.alpha_s", c.intra.alpha_s, false},
                {"intra.beta_bytes_per_s", c.intra.beta_bytes_per_s, true},
                {"inter.alpha_s", c.inter.alpha_s, false},
                {"inter.beta_bytes_per_s", c.inter.beta_bytes_per_s, true},
                {"overhead_s", c.overhead_s, false},
                {"op_overhead_s", c.op_overhead_s, false},
                {"message_cpu_s", c.message_cpu_s, false},
                {"reduce_bytes_per_s", c.reduce_bytes_per_s, false},
                // Stored with the rest: a non-finite one would be written as null and the file
                // would no longer load.
                {"rms_relative_error", c.rms_relative_error, false}};
  for (const auto& f : fields) {
    if (!std::isfinite(f.value) || f.value < 0 || (f.positive && f.value <= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration ", f.name, " = ", f.value,
                       f.positive ? ": must be finite and > 0" : ": must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

std::string ToJson(const Calibration& c) {
  nlohmann::json j = {
      {"intra", {{"alpha_s", c.intra.alpha_s}, {"beta_bytes_per_s", c.intra.beta_bytes_per_s}}},
      {"inter", {{"alpha_s", c.inter.alpha_s}, {"beta_bytes_per_s", c.inter.beta_bytes_per_s}}},
      {"overhead_s", c.overhead_s},
      {"op_overhead_s", c.op_overhead_s},
      {"message_cpu_s", c.message_cpu_s},
      {"reduce_bytes_per_s", c.reduce_bytes_per_s},
      {"source", c.source},
      {"op", c.op},
      {"algorithm", c.algorithm},
      {"placement", c.placement},
      {"topology", c.topology},
      {"fitted_at", c.fitted_at},
      {"nranks", c.nranks},
      {"nnodes", c.nnodes},
      {"samples", c.samples},
      {"rms_relative_error", c.rms_relative_error}};
  return j.dump(2);
}

absl::StatusOr<Calibration> FromJson(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("calibration: not a JSON object");
  }
  Calibration c;
  try {
    c.intra.alpha_s = j.at("intra").at("alpha_s").get<double>();
    c.intra.beta_bytes_per_s = j.at("intra").at("beta_bytes_per_s").get<double>();
    c.inter.alpha_s = j.at("inter").at("alpha_s").get<double>();
    c.inter.beta_bytes_per_s = j.at("inter").at("beta_bytes_per_s").get<double>();
    c.overhead_s = j.value("overhead_s", 0.0);
    c.op_overhead_s = j.value("op_overhead_s", 0.0);
    // A file written before the field existed: the built-in figure, as a fit keeps it.
    c.message_cpu_s = j.value("message_cpu_s", Calibration::Defaults().message_cpu_s);
    c.reduce_bytes_per_s =
        j.value("reduce_bytes_per_s", Calibration::Defaults().reduce_bytes_per_s);
    c.source = j.value("source", std::string("fit"));
    c.op = j.value("op", std::string());
    c.algorithm = j.value("algorithm", std::string());
    c.placement = j.value("placement", std::string());
    c.topology = j.value("topology", std::string());
    c.fitted_at = j.value("fitted_at", std::string());
    c.rms_relative_error = j.value("rms_relative_error", 0.0);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("calibration: ", e.what()));
  }
  for (auto [name, field] : {std::pair<const char*, int*>{"nranks", &c.nranks},
                             {"nnodes", &c.nnodes},
                             {"samples", &c.samples}}) {
    absl::StatusOr<int> v = IntField(j, name);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  if (absl::Status s = Validate(c); !s.ok()) return s;
  return c;
}

absl::Status SaveCalibration(const std::string& state_dir, const Calibration& c) {
  if (absl::Status s = Validate(c); !s.ok()) return s;
  const std::string path = state_dir + "/calibration.json";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << ToJson(c) << "\n";
    if (!out.good()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<Calibration> LoadCalibration(const std::string& state_dir) {
  const std::string path = state_dir + "/calibration.json";
  std::ifstream in(path);
  if (!in.good()) return absl::NotFoundError(absl::StrCat("no calibration at ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<Calibration> c = FromJson(ss.str());
  if (!c.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", c.status().message()));
  }
  return c;
}

namespace {

// Weighted non-negative least squares for T = c * 1 (when with_constant) + x * L + y * B, on
// relative error (row i weighted by 1/T_i). Every subset of the columns is solved on its own
// (at most 7, each a system of at most 3 equations) and the best solution with no negative
// coefficient wins: that is the constrained optimum, since it lies on the face of the feasible
// set where its zero coefficients are held at zero.
absl::StatusOr<LinearFit> FitNonNegative(const std::vector<Sample>& samples, bool with_constant) {
  const size_t need = with_constant ? 3 : 2;
  if (samples.size() < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("a fit needs at least ", need, " sizes (got ", samples.size(), ")"));
  }
  for (const Sample& s : samples) {
    if (!(s.measured_s > 0) || !std::isfinite(s.measured_s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("measured time ", s.measured_s, " s is not positive"));
    }
    if (!std::isfinite(s.latency_units) || !std::isfinite(s.bytes_units) || s.latency_units < 0 ||
        s.bytes_units < 0) {
      return absl::InvalidArgumentError(absl::StrCat("schedule units ", s.latency_units, " and ",
                                                     s.bytes_units, " are not finite and >= 0"));
    }
  }
  constexpr int kConst = 0, kLat = 1, kBytes = 2;
  const auto column = [](const Sample& s, int c) {
    return c == kConst ? 1.0 : c == kLat ? s.latency_units : s.bytes_units;
  };
  const auto relative_sq = [&](const double coef[3]) {
    double e = 0;
    for (const Sample& s : samples) {
      double t = 0;
      for (int c = 0; c < 3; ++c) t += coef[c] * column(s, c);
      const double r = (t - s.measured_s) / s.measured_s;
      e += r * r;
    }
    return e;
  };
  double best[3] = {0, 0, 0};
  double best_e = -1;
  for (int mask = 1; mask < 8; ++mask) {
    if (!with_constant && (mask & (1 << kConst))) continue;
    int cols[3], n = 0;
    for (int c = 0; c < 3; ++c) {
      if (mask & (1 << c)) cols[n++] = c;
    }
    // Normal equations of the weighted rows (a_i / T_i) . v = 1.
    double m[3][4] = {};
    for (const Sample& s : samples) {
      const double w = 1 / s.measured_s;
      for (int r = 0; r < n; ++r) {
        for (int c = 0; c < n; ++c) m[r][c] += w * column(s, cols[r]) * w * column(s, cols[c]);
        m[r][n] += w * column(s, cols[r]);
      }
    }
    // Gauss-Jordan with partial pivoting; a pivot below 1e-12 of its column's diagonal (the
    // columns are collinear over this sweep) leaves the subset out.
    bool singular = false;
    double diag[3];
    for (int r = 0; r < n; ++r) diag[r] = m[r][r];
    for (int p = 0; p < n && !singular; ++p) {
      int piv = p;
      for (int r = p + 1; r < n; ++r) {
        if (std::fabs(m[r][p]) > std::fabs(m[piv][p])) piv = r;
      }
      if (!(std::fabs(m[piv][p]) > 1e-12 * diag[p])) {
        singular = true;
        break;
      }
      for (int c = 0; c <= n; ++c) std::swap(m[p][c], m[piv][c]);
      for (int r = 0; r < n; ++r) {
        if (r == p) continue;
        const double f = m[r][p] / m[p][p];
        for (int c = p; c <= n; ++c) m[r][c] -= f * m[p][c];
      }
    }
    if (singular) continue;
    double coef[3] = {0, 0, 0};
    bool feasible = true;
    for (int r = 0; r < n; ++r) {
      coef[cols[r]] = m[r][n] / m[r][r];
      if (!(coef[cols[r]] >= 0) || !std::isfinite(coef[cols[r]])) feasible = false;
    }
    if (!feasible) continue;
    const double e = relative_sq(coef);
    if (best_e < 0 || e < best_e) {
      best_e = e;
      std::copy(coef, coef + 3, best);
    }
  }
  if (best_e < 0) {
    return absl::InvalidArgumentError(
        "the sweep's sizes cost the same schedule units (a degenerate sweep): sweep more sizes");
  }
  // A bandwidth term that explains almost nothing of any sample is rounding, not a measurement
  // (its beta would be astronomical).
  double bytes_share = 0;
  for (const Sample& s : samples) {
    bytes_share = std::max(bytes_share, best[kBytes] * s.bytes_units / s.measured_s);
  }
  if (!(bytes_share >= 1e-3)) {
    return absl::InvalidArgumentError(
        "the sweep does not determine a bandwidth (time does not grow with size): sweep larger "
        "sizes");
  }
  LinearFit fit;
  fit.link = {best[kLat], 1 / best[kBytes]};
  fit.overhead_s = best[kConst];
  fit.rms_relative_error = std::sqrt(best_e / samples.size());
  return fit;
}

}  // namespace

absl::StatusOr<LinearFit> FitLinkClass(const std::vector<Sample>& samples) {
  return FitNonNegative(samples, /*with_constant=*/false);
}

absl::StatusOr<LinearFit> FitLinkClassWithOverhead(const std::vector<Sample>& samples) {
  return FitNonNegative(samples, /*with_constant=*/true);
}

}  // namespace railyard::scheduler::cost
