// The daemon's own node topology (rails) from `--topology FILE` (JSON), or the default: one rail
// on whatever device UCX picks. Discovery from sysfs arrives with the topology issue.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "railyard/v1/topology.pb.h"

namespace railyard {

// INVALID_ARGUMENT naming the file and the JSON error; NOT_FOUND when it cannot be read.
absl::StatusOr<v1::NodeTopology> LoadNodeTopology(const std::string& path);
absl::StatusOr<v1::NodeTopology> ParseNodeTopology(const std::string& json);
v1::NodeTopology DefaultNodeTopology();

}  // namespace railyard
