// One node's topology graph: its local GPUs (ranks), NICs and the rails on them, NUMA nodes and
// their CPUs, the intra-node link class, and the fabric above the node when known. Built from a
// railyard.v1.NodeTopology (a topology file, discovery, or both merged: discovery.h); rendered as
// a text tree for people (`railctl topo`) and as proto JSON for programs (`railctl topo --json`).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/topology/fabric.h"
#include "railyard/v1/topology.pb.h"

namespace railyard::topology {

struct GpuNode {
  int index = 0;
  std::string name;        // model
  std::string pci_bus_id;  // "0000:18:00.0"
  int numa_node = -1;      // -1: unknown
};

// A NIC as the graph shows it: one entry per rail (rail >= 0, named after the rail, on its
// device), then one per NIC no rail uses (rail == -1, named after the interface).
struct NicNode {
  std::string name;
  std::string device;      // interface or RDMA port; "" for a rail on UCX's choice
  double speed_gbps = 0;   // 0: unknown
  int numa_node = -1;      // -1: unknown
  int rail = -1;           // rail index, -1 when no rail uses it
  std::string transports;  // UCX_TLS of a rail ("" = tcp)
  std::string state;       // "up", "down", "unknown", "ACTIVE", ...; "" when not discovered
  bool is_virtual = false;
  std::string rdma_device;  // "mlx5_0:1"
};

struct NumaNodeInfo {
  int id = 0;
  std::vector<int> cpus;
};

class TopologyGraph {
 public:
  // INVALID_ARGUMENT (naming the field) for what topology_file.h's ParseTopology rejects.
  static absl::StatusOr<TopologyGraph> FromProto(const v1::NodeTopology& topology);

  const std::string& node() const { return proto_.node(); }
  const std::vector<GpuNode>& gpus() const { return gpus_; }
  const std::vector<NicNode>& nics() const { return nics_; }
  const std::vector<NumaNodeInfo>& numa_nodes() const { return numa_; }
  int rails() const { return proto_.rails_size(); }
  int cpu_count() const;
  // Absent when the topology does not give the intra-node link class / a fabric section.
  const std::optional<LinkClass>& intra() const { return intra_; }
  const std::optional<FabricSpec>& fabric() const { return fabric_; }

  const v1::NodeTopology& proto() const { return proto_; }
  // Indented tree: the node, then per NUMA node its CPUs, GPUs and NICs, then the fabric.
  std::string ToText() const;
  // The proto JSON mapping with the file's field names (snake_case), so the output of
  // `railctl topo --json` is itself a valid topology file.
  std::string ToJson() const;

 private:
  v1::NodeTopology proto_;
  std::vector<GpuNode> gpus_;
  std::vector<NicNode> nics_;
  std::vector<NumaNodeInfo> numa_;
  std::optional<LinkClass> intra_;
  std::optional<FabricSpec> fabric_;
};

// Kernel cpulist syntax ("0-3,8,10-11"; "" is no CPU) -> sorted CPU ids. INVALID_ARGUMENT for
// anything else (reversed ranges, negative ids, junk).
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text);
// The reverse, with ranges collapsed: {0,1,2,3,8} -> "0-3,8".
std::string FormatCpuList(const std::vector<int>& cpus);

}  // namespace railyard::topology
