// Fuzz target: topology files (daemon/topology/topology_file.h: `railyardd --topology`, railctl
// model/simulate --topology) and the units and cpulists inside them (units.h, topology_graph.h).
// Properties: what ParseTopology accepts builds a TopologyGraph (the header's contract), renders
// as text, and its JSON (`railctl topo --json`) parses back to the same message; its cpulists are
// sorted, unique, below 2^20 and round-trip through FormatCpuList; its fabric section gives a
// spec within the documented limits; ParseNodeTopology accepts exactly the files with 1..64
// rails and names them all; rejections are INVALID_ARGUMENT. The raw input as a size, duration
// and bandwidth: accepted values are finite, non-negative (bandwidth positive).
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/topology/fabric.h"
#include "daemon/topology/topology_file.h"
#include "daemon/topology/topology_graph.h"
#include "daemon/topology/units.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/quiet_protobuf.h"

namespace railyard::topology {
namespace {

std::string Bytes(const v1::NodeTopology& t) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  t.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

void CheckLink(const LinkClass& l, absl::string_view which) {
  FUZZ_CHECK(std::isfinite(l.alpha_s) && l.alpha_s >= 0, absl::StrCat(which, " alpha ", l.alpha_s));
  FUZZ_CHECK(std::isfinite(l.beta_bytes_per_s) && l.beta_bytes_per_s >= 0,
             absl::StrCat(which, " bandwidth ", l.beta_bytes_per_s));
}

void CheckFabric(const FabricSpec& f) {
  FUZZ_CHECK(f.nodes >= 1 && f.nodes <= (1 << 24), absl::StrCat("nodes ", f.nodes));
  FUZZ_CHECK(f.ranks_per_node >= 1, absl::StrCat("ranks_per_node ", f.ranks_per_node));
  FUZZ_CHECK(int64_t{f.nodes} * f.ranks_per_node <= (int64_t{1} << 24),
             absl::StrCat(f.nodes, " x ", f.ranks_per_node, " ranks"));
  FUZZ_CHECK(f.rails >= 1, absl::StrCat("rails ", f.rails));
  if (f.kind == FabricKind::kTorus) {
    int64_t product = 1;
    for (int d : f.torus_dims) product *= d;
    FUZZ_CHECK(product == f.nodes, absl::StrCat("torus of ", product, " nodes, nodes ", f.nodes));
  }
  if (f.kind == FabricKind::kThreeTier) {
    FUZZ_CHECK(f.nodes_per_rack >= 1 && f.nodes % f.nodes_per_rack == 0,
               absl::StrCat(f.nodes, " nodes in racks of ", f.nodes_per_rack));
  }
  FUZZ_CHECK(f.oversubscription >= 1 && std::isfinite(f.oversubscription),
             absl::StrCat("oversubscription ", f.oversubscription));
  CheckLink(f.intra, "intra");
  CheckLink(f.inter, "inter");
  FUZZ_CHECK(std::isfinite(f.overhead_s) && f.overhead_s >= 0,
             absl::StrCat("cpu overhead ", f.overhead_s));
}

void CheckCpuList(const std::string& text) {
  absl::StatusOr<std::vector<int>> cpus = ParseCpuList(text);
  FUZZ_CHECK(cpus.ok(), "a cpulist ParseTopology accepted does not parse");
  for (size_t i = 0; i < cpus->size(); ++i) {
    FUZZ_CHECK((*cpus)[i] >= 0 && (*cpus)[i] < (1 << 20), absl::StrCat("cpu ", (*cpus)[i]));
    FUZZ_CHECK(i == 0 || (*cpus)[i - 1] < (*cpus)[i], "cpus not sorted and unique");
  }
  absl::StatusOr<std::vector<int>> again = ParseCpuList(FormatCpuList(*cpus));
  FUZZ_CHECK(again.ok() && *again == *cpus, "FormatCpuList does not round-trip");
}

void CheckTopology(const std::string& json) {
  absl::StatusOr<v1::NodeTopology> topo = ParseTopology(json);
  absl::StatusOr<v1::NodeTopology> node = ParseNodeTopology(json);
  if (!topo.ok()) {
    FUZZ_CHECK(topo.status().code() == absl::StatusCode::kInvalidArgument,
               topo.status().ToString());
    FUZZ_CHECK(!node.ok(), "ParseNodeTopology accepts what ParseTopology rejects");
    return;
  }
  const bool rails_ok = topo->rails_size() >= 1 && topo->rails_size() <= 64;
  FUZZ_CHECK(node.ok() == rails_ok, absl::StrCat("ParseNodeTopology with ", topo->rails_size(),
                                                 " rails: ", node.status().ToString()));
  if (node.ok()) {
    for (const v1::Rail& rail : node->rails()) FUZZ_CHECK(!rail.name().empty(), "unnamed rail");
  } else {
    FUZZ_CHECK(node.status().code() == absl::StatusCode::kInvalidArgument,
               node.status().ToString());
  }

  for (const v1::NumaNode& numa : topo->numa_nodes()) CheckCpuList(numa.cpus());
  absl::StatusOr<TopologyGraph> graph = TopologyGraph::FromProto(*topo);
  FUZZ_CHECK(graph.ok(), absl::StrCat("accepted file, no graph: ", graph.status().message()));
  FUZZ_CHECK(!graph->ToText().empty(), "empty text rendering");
  FUZZ_CHECK(graph->fabric().has_value() == topo->has_fabric(), "fabric lost in the graph");
  if (graph->fabric().has_value()) CheckFabric(*graph->fabric());
  if (graph->intra().has_value()) CheckLink(*graph->intra(), "intra");

  absl::StatusOr<v1::NodeTopology> back = ParseTopology(graph->ToJson());
  FUZZ_CHECK(back.ok(),
             absl::StrCat("railctl topo --json output does not parse: ", back.status().message()));
  FUZZ_CHECK(Bytes(*back) == Bytes(*topo), "railctl topo --json output is another topology");
}

void CheckUnits(absl::string_view text) {
  if (absl::StatusOr<double> v = ParseBytes(text); v.ok()) {
    FUZZ_CHECK(std::isfinite(*v) && *v >= 0, absl::StrCat("size ", *v));
  }
  if (absl::StatusOr<double> v = ParseDuration(text); v.ok()) {
    FUZZ_CHECK(std::isfinite(*v) && *v >= 0, absl::StrCat("duration ", *v));
  }
  if (absl::StatusOr<double> v = ParseBandwidth(text); v.ok()) {
    FUZZ_CHECK(std::isfinite(*v) && *v > 0, absl::StrCat("bandwidth ", *v));
  }
}

}  // namespace
}  // namespace railyard::topology

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  railyard::topology::CheckTopology(text);
  if (size <= 64) railyard::topology::CheckUnits(text);
  return 0;
}
