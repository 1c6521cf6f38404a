#include "daemon/scheduler/cost/calibration.h"

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
  c.inter = {60e-6, 1.0e9};
  c.overhead_s = 5e-6;
  c.op_overhead_s = 300e-6;
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

absl::StatusOr<LinearFit> FitLinkClass(const std::vector<Sample>& samples) {
  if (samples.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a fit needs at least 2 sizes (got ", samples.size(), ")"));
  }
  // Weighted least squares for T = x * L + y * B (x = alpha, y = 1/beta), weights 1/T^2.
  double sll = 0, slb = 0, sbb = 0, slt = 0, sbt = 0;
  for (const Sample& s : samples) {
    if (!(s.measured_s > 0) || !std::isfinite(s.measured_s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("measured time ", s.measured_s, " s is not positive"));
    }
    const double w = 1 / (s.measured_s * s.measured_s);
    sll += w * s.latency_units * s.latency_units;
    slb += w * s.latency_units * s.bytes_units;
    sbb += w * s.bytes_units * s.bytes_units;
    slt += w * s.latency_units * s.measured_s;
    sbt += w * s.bytes_units * s.measured_s;
  }
  double x = 0, y = 0;
  const double det = sll * sbb - slb * slb;
  if (det > 1e-12 * sll * sbb) {
    x = (slt * sbb - sbt * slb) / det;
    y = (sll * sbt - slb * slt) / det;
  }
  // Constrained to x, y >= 0: fall back to the best one-parameter fit.
  if (!(det > 1e-12 * sll * sbb) || x < 0 || y < 0) {
    const double x_only = sll > 0 ? slt / sll : 0;
    const double y_only = sbb > 0 ? sbt / sbb : 0;
    auto err = [&](double a, double b) {
      double e = 0;
      for (const Sample& s : samples) {
        const double r = (a * s.latency_units + b * s.bytes_units - s.measured_s) / s.measured_s;
        e += r * r;
      }
      return e;
    };
    if (x < 0 || y < 0 || !(det > 1e-12 * sll * sbb)) {
      if (err(x_only, 0) <= err(0, y_only)) {
        x = x_only;
        y = 0;
      } else {
        x = 0;
        y = y_only;
      }
    }
  }
  if (!(y > 0)) {
    return absl::InvalidArgumentError(
        "the sweep does not determine a bandwidth (time does not grow with size): sweep larger "
        "sizes");
  }
  LinearFit fit;
  fit.link = {x, 1 / y};
  double e = 0;
  for (const Sample& s : samples) {
    const double r = (x * s.latency_units + y * s.bytes_units - s.measured_s) / s.measured_s;
    e += r * r;
  }
  fit.rms_relative_error = std::sqrt(e / samples.size());
  return fit;
}

}  // namespace railyard::scheduler::cost
