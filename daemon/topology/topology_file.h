// Topology files (JSON in the proto3 JSON mapping of railyard.v1.NodeTopology, docs/topology.md):
// a daemon's own node (`railyardd --topology FILE`: its rails, optionally GPUs, NUMA nodes, NICs
// and the intra-node link class) and, with a "fabric" section, a whole cluster for the cost model
// and the simulator. Every error is INVALID_ARGUMENT naming the file and the field (NOT_FOUND
// when the file cannot be read).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/topology/fabric.h"
#include "railyard/v1/topology.pb.h"

namespace railyard::topology {

// Any topology file: JSON syntax, then the node part (intra link class, GPUs, NUMA cpulists)
// and, when present, the fabric section are checked. Rails are optional here.
absl::StatusOr<v1::NodeTopology> ParseTopology(const std::string& json);
absl::StatusOr<v1::NodeTopology> LoadTopology(const std::string& path);

// A daemon's --topology file: as above, and it must declare 1..64 rails; unnamed rails get
// "rail<i>".
absl::StatusOr<v1::NodeTopology> ParseNodeTopology(const std::string& json);
absl::StatusOr<v1::NodeTopology> LoadNodeTopology(const std::string& path);
// Without --topology: one rail on whatever device UCX picks.
v1::NodeTopology DefaultNodeTopology();

// The fabric a file describes: its "fabric" section plus the node part's intra link class, and
// defaults from the node part (ranks_per_node: its GPUs; rails and the inter bandwidth: its
// rails). INVALID_ARGUMENT without a fabric section or when a field is out of range.
absl::StatusOr<FabricSpec> FabricFromTopology(const v1::NodeTopology& topology);
absl::StatusOr<FabricSpec> ParseFabric(const std::string& json);
absl::StatusOr<FabricSpec> LoadFabricFile(const std::string& path);

// A whole file as text; NOT_FOUND "cannot read <what> <path>" when it cannot be opened. Also
// what railctl reads the simulator's jobs files with.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what);

// {"alpha": "3us", "bandwidth": "50GB/s"} -> LinkClass; `field` names it in errors
// ("fabric.inter"). A missing alpha is 0; a missing bandwidth is an error when required.
absl::StatusOr<LinkClass> ParseLinkClass(const v1::LinkClassSpec& spec, absl::string_view field,
                                         bool bandwidth_required);

}  // namespace railyard::topology
