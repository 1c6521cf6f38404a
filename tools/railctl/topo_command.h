// `railctl topo [--json] [--socket S] [--discover [--sysroot DIR]] [--file F]`: a node's topology
// graph (GPUs, NICs and rails, NUMA nodes, link classes) from a running daemon
// (Admin.GetTopology), from discovery on this machine, or from a topology file with its fabric.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace railyard::railctl {

absl::Status RunTopo(const std::vector<std::string>& args);

}  // namespace railyard::railctl
