// The Prometheus text exposition format, version 0.0.4: what /metrics serves.
// https://prometheus.io/docs/instrumenting/exposition_formats/
#pragma once

#include <string>
#include <string_view>

#include "daemon/metrics/registry.h"

namespace railyard::metrics {

inline constexpr std::string_view kTextContentType = "text/plain; version=0.0.4; charset=utf-8";

// Every family of the registry (after its collect hooks ran): # HELP and # TYPE lines, then one
// line per child (histograms: _bucket{le=...} per bound and +Inf, _sum, _count). Families sorted
// by name, children by labels: the same state renders the same text.
std::string RenderText(const Registry& registry);

// Label value escaping: backslash, double quote and line feed as \\, \" and \n.
std::string EscapeLabelValue(std::string_view v);
// HELP text escaping: backslash and line feed.
std::string EscapeHelp(std::string_view v);
// A sample value: integers exactly (up to 2^53), +Inf, -Inf, NaN, else shortest round-trip.
std::string FormatValue(double v);

}  // namespace railyard::metrics
