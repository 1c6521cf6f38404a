#include "daemon/topology/topology_graph.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "daemon/topology/topology_file.h"
#include "daemon/topology/units.h"
#include "google/protobuf/util/json_util.h"

namespace railyard::topology {
namespace {

constexpr int kMaxCpuId = 1 << 20;

std::string SpeedText(double gbps) {
  return gbps > 0 ? absl::StrFormat("%g Gbit/s", gbps) : std::string("speed ?");
}

std::string LinkText(const LinkClass& link) {
  return absl::StrCat("alpha ", FormatDuration(link.alpha_s), ", ",
                      link.beta_bytes_per_s > 0 ? FormatBandwidth(link.beta_bytes_per_s)
                                                : std::string("bandwidth ?"));
}

// The NIC a rail's device names: the interface itself or its RDMA port.
const v1::Nic* FindNic(const v1::NodeTopology& topo, const std::string& device) {
  if (device.empty()) return nullptr;
  for (const v1::Nic& nic : topo.nics()) {
    if (nic.name() == device || nic.rdma_device() == device) return &nic;
  }
  return nullptr;
}

// Digits only: no sign, no spaces inside.
bool ParseCpuId(absl::string_view text, int* id) {
  if (text.empty() || text.size() > 7) return false;
  int v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *id = v;
  return true;
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text) {
  std::vector<int> cpus;
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  if (trimmed.empty()) return cpus;
  // Ranges first, merged, then expanded: repeated or overlapping ranges ("0-1048575,0-1048575,...")
  // cost no more than the distinct CPUs they name (at most kMaxCpuId).
  std::vector<std::pair<int, int>> ranges;
  for (absl::string_view part : absl::StrSplit(trimmed, ',')) {
    part = absl::StripAsciiWhitespace(part);
    const size_t dash = part.find('-');
    const bool is_range = dash != absl::string_view::npos;
    int first = 0;
    int last = 0;
    if (!ParseCpuId(part.substr(0, dash), &first) ||
        (is_range && !ParseCpuId(part.substr(dash + 1), &last))) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad cpulist '", text, "': '", part, "' is not N or N-M"));
    }
    if (!is_range) last = first;
    if (last < first || last >= kMaxCpuId) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad cpulist '", text, "': range '", part, "' is empty or out of range"));
    }
    ranges.emplace_back(first, last);
  }
  std::sort(ranges.begin(), ranges.end());
  int next = 0;  // every CPU below it is in cpus already
  for (const auto& [first, last] : ranges) {
    for (int c = std::max(first, next); c <= last; ++c) cpus.push_back(c);
    next = std::max(next, last + 1);
  }
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<TopologyGraph> TopologyGraph::FromProto(const v1::NodeTopology& topology) {
  TopologyGraph g;
  g.proto_ = topology;
  for (const v1::Gpu& gpu : topology.gpus()) {
    if (gpu.index() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("gpus: index ", gpu.index(), " is < 0"));
    }
    g.gpus_.push_back(
        {gpu.index(), gpu.name(), gpu.pci_bus_id(), gpu.has_numa_node() ? gpu.numa_node() : -1});
  }
  std::sort(g.gpus_.begin(), g.gpus_.end(),
            [](const GpuNode& a, const GpuNode& b) { return a.index < b.index; });
  for (int i = 1; i < static_cast<int>(g.gpus_.size()); ++i) {
    if (g.gpus_[i].index == g.gpus_[i - 1].index) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpus: index ", g.gpus_[i].index, " appears twice"));
    }
  }
  for (const v1::NumaNode& numa : topology.numa_nodes()) {
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(numa.cpus());
    if (!cpus.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("numa_nodes[id ", numa.id(), "].cpus: ", cpus.status().message()));
    }
    g.numa_.push_back({numa.id(), *std::move(cpus)});
  }
  std::sort(g.numa_.begin(), g.numa_.end(),
            [](const NumaNodeInfo& a, const NumaNodeInfo& b) { return a.id < b.id; });

  // Rails first (what the daemon sends on), each with what is known of its NIC; then the NICs
  // no rail uses.
  std::set<const v1::Nic*> used;
  for (int i = 0; i < topology.rails_size(); ++i) {
    const v1::Rail& rail = topology.rails(i);
    NicNode n;
    n.name = rail.name().empty() ? absl::StrCat("rail", i) : rail.name();
    n.device = rail.device();
    n.rail = i;
    n.transports = rail.transports();
    n.speed_gbps = rail.speed_gbps();
    n.numa_node = rail.has_numa_node() ? rail.numa_node() : -1;
    if (const v1::Nic* nic = FindNic(topology, rail.device()); nic != nullptr) {
      used.insert(nic);
      if (n.speed_gbps <= 0) n.speed_gbps = nic->speed_gbps();
      if (n.numa_node < 0 && nic->has_numa_node()) n.numa_node = nic->numa_node();
      n.state = nic->state();
      n.is_virtual = nic->is_virtual();
      n.rdma_device = nic->rdma_device();
    }
    g.nics_.push_back(std::move(n));
  }
  for (const v1::Nic& nic : topology.nics()) {
    if (used.count(&nic) > 0) continue;
    NicNode n;
    n.name = nic.name();
    n.device = nic.name();
    n.speed_gbps = nic.speed_gbps();
    n.numa_node = nic.has_numa_node() ? nic.numa_node() : -1;
    n.state = nic.state();
    n.is_virtual = nic.is_virtual();
    n.rdma_device = nic.rdma_device();
    g.nics_.push_back(std::move(n));
  }

  if (topology.has_intra()) {
    absl::StatusOr<LinkClass> intra =
        ParseLinkClass(topology.intra(), "intra", /*bandwidth_required=*/false);
    if (!intra.ok()) return intra.status();
    g.intra_ = *intra;
  }
  if (topology.has_fabric()) {
    absl::StatusOr<FabricSpec> fabric = FabricFromTopology(topology);
    if (!fabric.ok()) return fabric.status();
    g.fabric_ = *fabric;
  }
  return g;
}

int TopologyGraph::cpu_count() const {
  int n = 0;
  for (const NumaNodeInfo& numa : numa_) n += static_cast<int>(numa.cpus.size());
  return n;
}

std::string TopologyGraph::ToText() const {
  const int other_nics = static_cast<int>(
      std::count_if(nics_.begin(), nics_.end(), [](const NicNode& n) { return n.rail < 0; }));
  std::string out = absl::StrFormat(
      "node %s: %d NUMA node%s, %d CPUs, %d GPU%s, %d rail%s, %d other NIC%s\n",
      node().empty() ? "(unnamed)" : node(), numa_.size(), numa_.size() == 1 ? "" : "s",
      cpu_count(), gpus_.size(), gpus_.size() == 1 ? "" : "s", rails(), rails() == 1 ? "" : "s",
      other_nics, other_nics == 1 ? "" : "s");
  if (!proto_.description().empty()) absl::StrAppend(&out, "  ", proto_.description(), "\n");
  if (intra_.has_value()) {
    absl::StrAppend(&out, "  intra-node links: ", LinkText(*intra_), " per port\n");
  }

  // Group GPUs and NICs under their NUMA node; -1 (unknown) last.
  std::set<int> ids;
  for (const NumaNodeInfo& numa : numa_) ids.insert(numa.id);
  for (const GpuNode& gpu : gpus_) ids.insert(gpu.numa_node);
  for (const NicNode& nic : nics_) ids.insert(nic.numa_node);
  std::vector<int> order(ids.begin(), ids.end());
  if (!order.empty() && order.front() == -1)
    std::rotate(order.begin(), order.begin() + 1, order.end());
  for (int id : order) {
    const auto numa = std::find_if(numa_.begin(), numa_.end(),
                                   [id](const NumaNodeInfo& n) { return n.id == id; });
    if (id < 0) {
      out += "  numa ?: placement unknown\n";
    } else if (numa == numa_.end()) {
      absl::StrAppend(&out, "  numa ", id, ": cpus unknown\n");
    } else {
      absl::StrAppend(&out, "  numa ", id, ": ", numa->cpus.size(), " CPUs ",
                      numa->cpus.empty() ? "(none)" : FormatCpuList(numa->cpus), "\n");
    }
    for (const GpuNode& gpu : gpus_) {
      if (gpu.numa_node != id) continue;
      absl::StrAppend(&out, "    gpu ", gpu.index, "  ", gpu.name.empty() ? "?" : gpu.name,
                      gpu.pci_bus_id.empty() ? "" : absl::StrCat("  pci ", gpu.pci_bus_id), "\n");
    }
    for (const NicNode& nic : nics_) {
      if (nic.numa_node != id) continue;
      std::string line = absl::StrCat("    nic ", nic.name);
      if (nic.device != nic.name) {
        absl::StrAppend(&line, "  device ", nic.device.empty() ? "(UCX's choice)" : nic.device);
      }
      absl::StrAppend(&line, "  ", SpeedText(nic.speed_gbps));
      if (nic.rail >= 0) {
        absl::StrAppend(&line, "  rail ", nic.rail, " (",
                        nic.transports.empty() ? "tcp" : nic.transports, ")");
      }
      if (!nic.rdma_device.empty() && nic.rdma_device != nic.device) {
        absl::StrAppend(&line, "  rdma ", nic.rdma_device);
      }
      if (!nic.state.empty()) absl::StrAppend(&line, "  ", nic.state);
      if (nic.is_virtual) absl::StrAppend(&line, "  virtual");
      out += line + "\n";
    }
  }

  if (fabric_.has_value()) {
    const FabricSpec& f = *fabric_;
    absl::StrAppend(&out, "fabric ", FabricKindName(f.kind), ": ", f.nodes, " nodes x ",
                    f.ranks_per_node, " rank", f.ranks_per_node == 1 ? "" : "s", " = ", f.nranks(),
                    " ranks, ", f.rails, " rail", f.rails == 1 ? "" : "s", " per node\n");
    if (f.kind == FabricKind::kTorus) {
      absl::StrAppend(&out, "  torus ", absl::StrJoin(f.torus_dims, "x"), "\n");
    }
    if (f.kind == FabricKind::kThreeTier) {
      absl::StrAppend(&out, "  ", f.nodes / f.nodes_per_rack, " racks of ", f.nodes_per_rack,
                      " nodes, leaf->spine ", absl::StrFormat("%g", f.oversubscription),
                      ":1 oversubscribed\n");
    }
    if (f.ranks_per_node > 1) {
      absl::StrAppend(&out, "  intra-node links: ", LinkText(f.intra), " per port\n");
    }
    absl::StrAppend(&out, "  inter-node links: ", LinkText(f.inter), " per NIC\n");
    if (f.overhead_s > 0)
      absl::StrAppend(&out, "  cpu overhead ", FormatDuration(f.overhead_s), "\n");
    if (f.in_network_reduction) out += "  in-network reduction (SHARP)\n";
  }
  return out;
}

std::string TopologyGraph::ToJson() const {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = true;
  std::string json;
  // A NodeTopology always converts (no Any, no maps).
  (void)google::protobuf::util::MessageToJsonString(proto_, &json, options);
  return json;
}

}  // namespace railyard::topology
