#include "daemon/metrics/exposition.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace railyard::metrics {
namespace {

void AppendLabels(const Labels& labels, const std::pair<std::string, std::string>* extra,
                  std::string* out) {
  if (labels.empty() && extra == nullptr) return;
  out->push_back('{');
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out->push_back(',');
    first = false;
    absl::StrAppend(out, k, "=\"", EscapeLabelValue(v), "\"");
  }
  if (extra != nullptr) {
    if (!first) out->push_back(',');
    absl::StrAppend(out, extra->first, "=\"", extra->second, "\"");
  }
  out->push_back('}');
}

void AppendSample(std::string_view name, const Labels& labels,
                  const std::pair<std::string, std::string>* extra, double value,
                  std::string* out) {
  out->append(name);
  AppendLabels(labels, extra, out);
  absl::StrAppend(out, " ", FormatValue(value), "\n");
}

absl::string_view TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  char buf[32];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string RenderText(const Registry& registry) {
  std::string out;
  for (const FamilyBase* f : registry.Collect()) {
    const std::vector<FamilyBase::Sample> samples = f->Collect();
    absl::StrAppend(&out, "# HELP ", f->name(), " ", EscapeHelp(f->help()), "\n");
    absl::StrAppend(&out, "# TYPE ", f->name(), " ", TypeName(f->type()), "\n");
    for (const auto& s : samples) {
      if (f->type() != MetricType::kHistogram) {
        AppendSample(f->name(), s.labels, nullptr, s.value, &out);
        continue;
      }
      const Histogram::Snapshot& h = s.histogram;
      const std::string bucket = absl::StrCat(f->name(), "_bucket");
      for (size_t i = 0; i < h.cumulative.size(); ++i) {
        const std::pair<std::string, std::string> le{
            "le", i < h.bounds.size() ? FormatValue(h.bounds[i]) : "+Inf"};
        AppendSample(bucket, s.labels, &le, static_cast<double>(h.cumulative[i]), &out);
      }
      AppendSample(absl::StrCat(f->name(), "_sum"), s.labels, nullptr, h.sum, &out);
      AppendSample(absl::StrCat(f->name(), "_count"), s.labels, nullptr,
                   static_cast<double>(h.count), &out);
    }
  }
  return out;
}

}  // namespace railyard::metrics
