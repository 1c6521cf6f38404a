#include "tools/railctl/fabric_flags.h"

#include <cstdint>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/topology/topology_file.h"
#include "daemon/topology/units.h"

namespace railyard::railctl {
namespace {

absl::StatusOr<std::vector<int>> ParseDims(const std::string& text) {
  std::vector<int> dims;
  for (absl::string_view part : absl::StrSplit(text, absl::ByAnyChar("xX"))) {
    int d = 0;
    if (!absl::SimpleAtoi(part, &d) || d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--torus '", text, "': expected XxY or XxYxZ with positive sizes"));
    }
    dims.push_back(d);
  }
  if (dims.size() < 2 || dims.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--torus '", text, "': expected 2 or 3 dimensions (XxY or XxYxZ)"));
  }
  return dims;
}

}  // namespace

const std::set<std::string>& FabricValueFlags() {
  static const auto* flags = new std::set<std::string>{
      "nranks",     "ranks-per-node", "rails",    "alpha", "beta",           "alpha-intra",
      "beta-intra", "overhead",       "topology", "torus", "nodes-per-rack", "oversubscription"};
  return *flags;
}

const std::set<std::string>& FabricBoolFlags() {
  static const auto* flags = new std::set<std::string>{"in-network"};
  return *flags;
}

absl::StatusOr<topology::FabricSpec> FabricFromFlags(const ParsedFlags& f) {
  if (f.Has("topology")) {
    for (const char* shorthand : {"nranks", "ranks-per-node", "rails", "torus"}) {
      if (f.Has(shorthand)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--topology and --", shorthand, " both describe the fabric: give one of them"));
      }
    }
    absl::StatusOr<topology::FabricSpec> spec = topology::LoadFabricFile(f.Get("topology"));
    if (!spec.ok()) return spec.status();
    // Link figures given on the command line override the file's (what-if questions).
    if (f.Has("alpha")) {
      absl::StatusOr<double> a = DurationFlag(f, "alpha", 0);
      if (!a.ok()) return a.status();
      spec->inter.alpha_s = *a;
    }
    if (f.Has("beta")) {
      absl::StatusOr<double> b = BandwidthFlag(f, "beta", 0);
      if (!b.ok()) return b.status();
      spec->inter.beta_bytes_per_s = *b;
    }
    if (f.Bool("in-network")) spec->in_network_reduction = true;
    return spec;
  }
  topology::FabricSpec spec;
  if (!f.Has("beta")) return absl::InvalidArgumentError("--beta (bandwidth per NIC) is required");
  absl::StatusOr<double> alpha = DurationFlag(f, "alpha", 0);
  if (!alpha.ok()) return alpha.status();
  absl::StatusOr<double> beta = BandwidthFlag(f, "beta", 0);
  if (!beta.ok()) return beta.status();
  absl::StatusOr<double> alpha_intra = DurationFlag(f, "alpha-intra", *alpha);
  if (!alpha_intra.ok()) return alpha_intra.status();
  absl::StatusOr<double> beta_intra = BandwidthFlag(f, "beta-intra", *beta);
  if (!beta_intra.ok()) return beta_intra.status();
  absl::StatusOr<double> overhead = DurationFlag(f, "overhead", 0);
  if (!overhead.ok()) return overhead.status();
  spec.inter = {*alpha, *beta};
  spec.intra = {*alpha_intra, *beta_intra};
  spec.overhead_s = *overhead;
  spec.in_network_reduction = f.Bool("in-network");

  if (f.Has("torus")) {
    absl::StatusOr<std::vector<int>> dims = ParseDims(f.Get("torus"));
    if (!dims.ok()) return dims.status();
    int64_t n = 1;
    for (int d : *dims) n *= d;
    if (n > (1 << 20)) return absl::InvalidArgumentError("--torus: more than 2^20 nodes");
    if (f.Has("nranks") && f.Get("nranks") != absl::StrCat(n)) {
      return absl::InvalidArgumentError(absl::StrCat("--nranks ", f.Get("nranks"),
                                                     " does not match --torus ", f.Get("torus"),
                                                     " (", n, " ranks)"));
    }
    if (f.Has("ranks-per-node") && f.Get("ranks-per-node") != "1") {
      return absl::InvalidArgumentError("--torus models one rank per node");
    }
    spec.kind = topology::FabricKind::kTorus;
    spec.torus_dims = *dims;
    spec.nodes = static_cast<int>(n);
    spec.ranks_per_node = 1;
    spec.rails = 1;
    return spec;
  }
  if (!f.Has("nranks")) return absl::InvalidArgumentError("--nranks is required");
  absl::StatusOr<int> n = IntFlag(f, "nranks", 0, 1);
  if (!n.ok()) return n.status();
  absl::StatusOr<int> g = IntFlag(f, "ranks-per-node", 1, 1);
  if (!g.ok()) return g.status();
  if (*n % *g != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nranks ", *n, " is not a multiple of --ranks-per-node ", *g));
  }
  absl::StatusOr<int> r = IntFlag(f, "rails", *g, 1);
  if (!r.ok()) return r.status();
  spec.nodes = *n / *g;
  spec.ranks_per_node = *g;
  spec.rails = *r;
  spec.kind =
      *g == 1 ? topology::FabricKind::kFlat
              : (*r > 1 ? topology::FabricKind::kRailOptimized : topology::FabricKind::kTwoTier);
  if (f.Has("nodes-per-rack") || f.Has("oversubscription")) {
    absl::StatusOr<int> p = IntFlag(f, "nodes-per-rack", 0, 1);
    if (!p.ok()) return p.status();
    if (!f.Has("nodes-per-rack")) {
      return absl::InvalidArgumentError("--oversubscription needs --nodes-per-rack");
    }
    double over = 1;
    if (f.Has("oversubscription") &&
        (!absl::SimpleAtod(f.Get("oversubscription"), &over) || !(over >= 1))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--oversubscription must be a number >= 1 (R:1), got '", f.Get("oversubscription"), "'"));
    }
    if (spec.nodes % *p != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--nodes-per-rack ", *p, " does not divide the ", spec.nodes, " nodes"));
    }
    spec.kind = topology::FabricKind::kThreeTier;
    spec.nodes_per_rack = *p;
    spec.oversubscription = over;
  }
  return spec;
}

absl::Status TunerCpuFromFlags(const ParsedFlags& f, scheduler::cost::TunerOptions* options) {
  absl::StatusOr<double> message_cpu = DurationFlag(f, "message-cpu", 0);
  if (!message_cpu.ok()) return message_cpu.status();
  options->message_cpu_s = *message_cpu;
  options->reduce_bytes_per_s = 0;
  if (f.Has("reduce-bw")) {
    absl::StatusOr<double> reduce = BandwidthFlag(f, "reduce-bw", 0);
    if (!reduce.ok()) return reduce.status();
    options->reduce_bytes_per_s = *reduce;
  }
  return absl::OkStatus();
}

}  // namespace railyard::railctl
