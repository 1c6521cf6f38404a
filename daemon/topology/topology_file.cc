#include "daemon/topology/topology_file.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/topology/topology_graph.h"
#include "daemon/topology/units.h"
#include "google/protobuf/util/json_util.h"

namespace railyard::topology {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// Prefixes an error with the file it came from.
absl::Status InFile(const std::string& path, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

bool SpeedOk(double gbps) { return std::isfinite(gbps) && gbps >= 0; }

// The node part: what a graph is built from (topology_graph.h) must make sense on its own.
absl::Status ValidateNode(const v1::NodeTopology& topo) {
  if (topo.has_intra()) {
    absl::StatusOr<LinkClass> intra =
        ParseLinkClass(topo.intra(), "intra", /*bandwidth_required=*/false);
    if (!intra.ok()) return intra.status();
  }
  std::set<int> indices;
  for (int i = 0; i < topo.gpus_size(); ++i) {
    const v1::Gpu& gpu = topo.gpus(i);
    const std::string field = absl::StrCat("gpus[", i, "]");
    if (gpu.index() < 0) return Invalid(field, absl::StrCat("index ", gpu.index(), " is < 0"));
    if (!indices.insert(gpu.index()).second) {
      return Invalid(field, absl::StrCat("index ", gpu.index(), " appears twice"));
    }
  }
  std::set<int> numa_ids;
  for (int i = 0; i < topo.numa_nodes_size(); ++i) {
    const v1::NumaNode& numa = topo.numa_nodes(i);
    const std::string field = absl::StrCat("numa_nodes[", i, "]");
    if (numa.id() < 0) return Invalid(field, absl::StrCat("id ", numa.id(), " is < 0"));
    if (!numa_ids.insert(numa.id()).second) {
      return Invalid(field, absl::StrCat("id ", numa.id(), " appears twice"));
    }
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(numa.cpus());
    if (!cpus.ok()) return Invalid(absl::StrCat(field, ".cpus"), cpus.status().message());
  }
  // Speeds become the fabric's inter bandwidth: NaN and Infinity (proto3 JSON spells both) are
  // refused like negative ones.
  for (int i = 0; i < topo.nics_size(); ++i) {
    if (topo.nics(i).name().empty()) return Invalid(absl::StrCat("nics[", i, "].name"), "empty");
    if (!SpeedOk(topo.nics(i).speed_gbps())) {
      return Invalid(absl::StrCat("nics[", i, "].speed_gbps"),
                     absl::StrCat(topo.nics(i).speed_gbps(), " is not a finite number >= 0"));
    }
  }
  for (int i = 0; i < topo.rails_size(); ++i) {
    if (!SpeedOk(topo.rails(i).speed_gbps())) {
      return Invalid(absl::StrCat("rails[", i, "].speed_gbps"),
                     absl::StrCat(topo.rails(i).speed_gbps(), " is not a finite number >= 0"));
    }
    if (!topo.rails(i).pace().empty()) {
      absl::StatusOr<double> pace = ParseBandwidth(topo.rails(i).pace());
      if (!pace.ok()) return Invalid(absl::StrCat("rails[", i, "].pace"), pace.status().message());
    }
  }
  if (topo.has_fabric()) {
    absl::StatusOr<FabricSpec> fabric = FabricFromTopology(topo);
    if (!fabric.ok()) return fabric.status();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LinkClass> ParseLinkClass(const v1::LinkClassSpec& spec, absl::string_view field,
                                         bool bandwidth_required) {
  LinkClass link;
  if (!spec.alpha().empty()) {
    absl::StatusOr<double> alpha = ParseDuration(spec.alpha());
    if (!alpha.ok()) return Invalid(absl::StrCat(field, ".alpha"), alpha.status().message());
    link.alpha_s = *alpha;
  }
  if (!spec.bandwidth().empty()) {
    absl::StatusOr<double> beta = ParseBandwidth(spec.bandwidth());
    if (!beta.ok()) return Invalid(absl::StrCat(field, ".bandwidth"), beta.status().message());
    link.beta_bytes_per_s = *beta;
  } else if (bandwidth_required) {
    return Invalid(absl::StrCat(field, ".bandwidth"), "missing (e.g. \"50GB/s\", \"400Gbit/s\")");
  }
  return link;
}

absl::StatusOr<FabricSpec> FabricFromTopology(const v1::NodeTopology& topo) {
  if (!topo.has_fabric()) {
    return absl::InvalidArgumentError("fabric: missing (the file describes a node, not a fabric)");
  }
  const v1::Fabric& f = topo.fabric();
  FabricSpec spec;
  if (f.kind().empty()) {
    return Invalid("fabric.kind", "missing (flat, two_tier, rail_optimized, three_tier, torus)");
  }
  if (!ParseFabricKind(f.kind(), &spec.kind)) {
    return Invalid("fabric.kind", absl::StrCat("unknown kind '", f.kind(),
                                               "' (flat, two_tier, rail_optimized, three_tier, "
                                               "torus)"));
  }

  // Nodes; a torus's come from its dimensions.
  if (spec.kind == FabricKind::kTorus) {
    if (f.torus_dims_size() < 2 || f.torus_dims_size() > 3) {
      return Invalid("fabric.torus_dims",
                     absl::StrCat("a torus has 2 or 3 dimensions, got ", f.torus_dims_size()));
    }
    int64_t product = 1;
    for (int i = 0; i < f.torus_dims_size(); ++i) {
      if (f.torus_dims(i) < 1) {
        return Invalid(absl::StrCat("fabric.torus_dims[", i, "]"),
                       absl::StrCat("must be >= 1, got ", f.torus_dims(i)));
      }
      product *= f.torus_dims(i);  // <= 2^24 * (2^31 - 1): no overflow
      spec.torus_dims.push_back(f.torus_dims(i));
      if (product > (int64_t{1} << 24)) return Invalid("fabric.torus_dims", "more than 2^24 nodes");
    }
    if (f.has_nodes() && f.nodes() != product) {
      return Invalid("fabric.torus_dims",
                     absl::StrCat(absl::StrJoin(spec.torus_dims, "x"), " = ", product,
                                  " nodes, but fabric.nodes is ", f.nodes()));
    }
    spec.nodes = static_cast<int>(product);
  } else {
    if (f.torus_dims_size() > 0) return Invalid("fabric.torus_dims", "only a torus has them");
    if (!f.has_nodes()) return Invalid("fabric.nodes", "missing");
    spec.nodes = f.nodes();
  }
  if (spec.nodes < 1)
    return Invalid("fabric.nodes", absl::StrCat("must be >= 1, got ", spec.nodes));
  if (spec.nodes > (1 << 24)) return Invalid("fabric.nodes", "more than 2^24 nodes");

  spec.ranks_per_node = f.has_ranks_per_node() ? f.ranks_per_node() : std::max(1, topo.gpus_size());
  if (spec.ranks_per_node < 1) {
    return Invalid("fabric.ranks_per_node",
                   absl::StrCat("must be >= 1, got ", spec.ranks_per_node));
  }
  if (spec.kind == FabricKind::kFlat && spec.ranks_per_node != 1) {
    return Invalid("fabric.ranks_per_node",
                   absl::StrCat("a flat fabric has one rank per node, got ", spec.ranks_per_node,
                                " (use two_tier)"));
  }
  if (int64_t{spec.nodes} * spec.ranks_per_node > (int64_t{1} << 24)) {
    return Invalid("fabric", "more than 2^24 ranks");
  }
  spec.rails = f.has_rails() ? f.rails() : std::max(1, topo.rails_size());
  if (spec.rails < 1)
    return Invalid("fabric.rails", absl::StrCat("must be >= 1, got ", spec.rails));

  if (spec.kind == FabricKind::kThreeTier) {
    if (!f.has_nodes_per_rack()) return Invalid("fabric.nodes_per_rack", "missing (three_tier)");
    spec.nodes_per_rack = f.nodes_per_rack();
    if (spec.nodes_per_rack < 1) {
      return Invalid("fabric.nodes_per_rack",
                     absl::StrCat("must be >= 1, got ", spec.nodes_per_rack));
    }
    if (spec.nodes % spec.nodes_per_rack != 0) {
      return Invalid("fabric.nodes_per_rack",
                     absl::StrCat(spec.nodes_per_rack, " does not divide fabric.nodes ", spec.nodes,
                                  " (racks must be full)"));
    }
  } else if (f.has_nodes_per_rack()) {
    return Invalid("fabric.nodes_per_rack", "only three_tier has racks");
  }
  if (f.has_oversubscription()) {
    if (!(std::isfinite(f.oversubscription()) && f.oversubscription() >= 1)) {
      return Invalid("fabric.oversubscription",
                     absl::StrCat("must be finite and >= 1 (R:1), got ", f.oversubscription()));
    }
    if (spec.kind != FabricKind::kThreeTier && f.oversubscription() != 1) {
      return Invalid("fabric.oversubscription", "only three_tier has an oversubscribed tier");
    }
    spec.oversubscription = f.oversubscription();
  }

  // Link classes. The inter bandwidth defaults to the slowest declared rail.
  absl::StatusOr<LinkClass> inter =
      ParseLinkClass(f.inter(), "fabric.inter", /*bandwidth_required=*/false);
  if (!inter.ok()) return inter.status();
  spec.inter = *inter;
  if (f.inter().bandwidth().empty()) {
    double slowest_gbps = 0;
    for (const v1::Rail& rail : topo.rails()) {
      if (rail.speed_gbps() > 0 && (slowest_gbps == 0 || rail.speed_gbps() < slowest_gbps)) {
        slowest_gbps = rail.speed_gbps();
      }
    }
    spec.inter.beta_bytes_per_s = slowest_gbps * 1e9 / 8;
    if (spec.nodes > 1 && slowest_gbps <= 0) {
      return Invalid("fabric.inter.bandwidth",
                     "missing, and no rail declares speed_gbps (e.g. \"inter\": {\"alpha\": "
                     "\"5us\", \"bandwidth\": \"400Gbit/s\"})");
    }
  }
  absl::StatusOr<LinkClass> intra =
      ParseLinkClass(topo.intra(), "intra", /*bandwidth_required=*/spec.ranks_per_node > 1);
  if (!intra.ok()) {
    if (topo.intra().bandwidth().empty()) {
      return Invalid("intra.bandwidth",
                     absl::StrCat("missing: ", spec.ranks_per_node,
                                  " ranks per node need the intra-node link class (e.g. \"intra\": "
                                  "{\"alpha\": \"0.5us\", \"bandwidth\": \"450GB/s\"})"));
    }
    return intra.status();
  }
  spec.intra = *intra;
  if (!f.cpu_overhead().empty()) {
    absl::StatusOr<double> o = ParseDuration(f.cpu_overhead());
    if (!o.ok()) return Invalid("fabric.cpu_overhead", o.status().message());
    spec.overhead_s = *o;
  }
  spec.in_network_reduction = f.in_network_reduction();
  return spec;
}

absl::StatusOr<v1::NodeTopology> ParseTopology(const std::string& json) {
  v1::NodeTopology topo;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(json, &topo, opts);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology JSON: ", std::string(status.message().data(), status.message().size())));
  }
  if (absl::Status s = ValidateNode(topo); !s.ok()) return s;
  return topo;
}

absl::StatusOr<v1::NodeTopology> LoadTopology(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path, "topology file");
  if (!text.ok()) return text.status();
  absl::StatusOr<v1::NodeTopology> topo = ParseTopology(*text);
  if (!topo.ok()) return InFile(path, topo.status());
  return topo;
}

absl::StatusOr<v1::NodeTopology> ParseNodeTopology(const std::string& json) {
  absl::StatusOr<v1::NodeTopology> topo = ParseTopology(json);
  if (!topo.ok()) return topo.status();
  if (topo->rails_size() == 0) {
    return absl::InvalidArgumentError("topology declares no rails (\"rails\": [...] is required)");
  }
  if (topo->rails_size() > 64) {
    return absl::InvalidArgumentError("topology declares more than 64 rails");
  }
  for (int i = 0; i < topo->rails_size(); ++i) {
    if (topo->rails(i).name().empty()) topo->mutable_rails(i)->set_name(absl::StrCat("rail", i));
  }
  return topo;
}

absl::StatusOr<v1::NodeTopology> LoadNodeTopology(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path, "topology file");
  if (!text.ok()) return text.status();
  absl::StatusOr<v1::NodeTopology> topo = ParseNodeTopology(*text);
  if (!topo.ok()) return InFile(path, topo.status());
  return topo;
}

v1::NodeTopology DefaultNodeTopology() {
  v1::NodeTopology topo;
  auto* rail = topo.add_rails();
  rail->set_name("rail0");
  return topo;
}

absl::StatusOr<FabricSpec> ParseFabric(const std::string& json) {
  absl::StatusOr<v1::NodeTopology> topo = ParseTopology(json);
  if (!topo.ok()) return topo.status();
  return FabricFromTopology(*topo);
}

absl::StatusOr<FabricSpec> LoadFabricFile(const std::string& path) {
  absl::StatusOr<v1::NodeTopology> topo = LoadTopology(path);
  if (!topo.ok()) return topo.status();
  absl::StatusOr<FabricSpec> fabric = FabricFromTopology(*topo);
  if (!fabric.ok()) return InFile(path, fabric.status());
  return fabric;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace railyard::topology
