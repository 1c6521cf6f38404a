#include "tools/railctl/model_command.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/scheduler/cost/closed_form.h"
#include "daemon/scheduler/cost/tuner.h"
#include "daemon/scheduler/op.h"
#include "daemon/topology/units.h"
#include "tools/railctl/fabric_flags.h"
#include "tools/railctl/flag_set.h"
#include "tools/railctl/text_table.h"

namespace railyard::railctl {
namespace {

using scheduler::OpKind;
using topology::FormatBytes;
using topology::FormatDuration;

constexpr const char* kUsage =
    "usage: railctl model OP --size SIZE --nranks N [--ranks-per-node G] [--rails R]\n"
    "                     --alpha T --beta BW [--alpha-intra T] [--beta-intra BW] [--overhead T]\n"
    "                     [--topology FILE | --torus XxY[xZ]] [--nodes-per-rack P "
    "--oversubscription X]\n"
    "                     [--in-network] [--algo A] [--ir-budget TRANSFERS] [--message-cpu T]\n"
    "                     [--reduce-bw BW] [--chunks S1,S2,...] [--json]\n"
    "       railctl model crossover --nranks N --alpha T --beta BW [--json]\n"
    "       railctl model critical-size --alpha T --beta BW [--json]\n"
    "OP: allreduce reducescatter allgather broadcast reduce alltoall barrier. SIZE is M of\n"
    "PRIMER.md: the buffer (allreduce, broadcast, reduce), the full buffer (allgather,\n"
    "reducescatter), bytes each rank sends in total (alltoall). Units: B KB MB GB (10^3),\n"
    "KiB MiB GiB; ns us ms s; GB/s Gbit/s. --beta is per NIC; --rails defaults to one NIC per\n"
    "local rank. --message-cpu T and --reduce-bw BW: a daemon's CPU per inter-node message at\n"
    "each end and the rate it reduces at, which a pipeline does not hide on a software\n"
    "transport: each schedule's prediction adds them for its busiest rank (the daemons take\n"
    "them from their calibration; docs/data-plane.md, \"What a message and a reduction cost a\n"
    "daemon\"). Default: not priced. --chunks: the chunk sizes tried (0: unchunked; default\n"
    "0,64KiB,256KiB,1MiB,4MiB; a daemon tries its --chunk_bytes / 4, / 2 and x 1).\n";

absl::StatusOr<topology::LinkClass> LinkFromFlags(const ParsedFlags& f) {
  if (!f.Has("alpha") || !f.Has("beta")) {
    return absl::InvalidArgumentError("--alpha and --beta are required");
  }
  absl::StatusOr<double> a = DurationFlag(f, "alpha", 0);
  if (!a.ok()) return a.status();
  absl::StatusOr<double> b = BandwidthFlag(f, "beta", 0);
  if (!b.ok()) return b.status();
  return topology::LinkClass{*a, *b};
}

absl::Status RunCriticalSize(const ParsedFlags& f) {
  absl::StatusOr<topology::LinkClass> link = LinkFromFlags(f);
  if (!link.ok()) return link.status();
  const double bytes = scheduler::cost::CriticalSize(*link);
  if (f.Bool("json")) {
    std::printf("%s\n", nlohmann::json({{"bytes", bytes}}).dump().c_str());
  } else {
    std::printf(
        "critical size n* = alpha * beta = %s (%.0f B): below it a message is "
        "latency-bound, above it bandwidth-bound\n",
        FormatBytes(bytes).c_str(), bytes);
  }
  return absl::OkStatus();
}

absl::Status RunCrossover(const ParsedFlags& f) {
  absl::StatusOr<topology::LinkClass> link = LinkFromFlags(f);
  if (!link.ok()) return link.status();
  if (!f.Has("nranks")) return absl::InvalidArgumentError("--nranks is required");
  absl::StatusOr<int> n = IntFlag(f, "nranks", 0, 2);
  if (!n.ok()) return n.status();
  absl::StatusOr<scheduler::cost::Crossover> c = scheduler::cost::RingTreeCrossover(*n, *link);
  if (!c.ok()) return c.status();
  if (f.Bool("json")) {
    std::printf("%s\n", nlohmann::json({{"exact_bytes", c->exact_bytes},
                                        {"log_estimate_bytes", c->log_estimate_bytes},
                                        {"rough_bytes", c->rough_bytes}})
                            .dump()
                            .c_str());
  } else {
    std::printf(
        "ring vs tree AllReduce crossover for N = %d (above it the ring is cheaper):\n"
        "  exact (power-of-two N)  %s\n"
        "  N alpha beta / log2 N   %s\n"
        "  N alpha beta            %s\n",
        *n, FormatBytes(c->exact_bytes).c_str(), FormatBytes(c->log_estimate_bytes).c_str(),
        FormatBytes(c->rough_bytes).c_str());
  }
  return absl::OkStatus();
}

// The OpShape of M bytes of float32 for op on n ranks (inverse of PrimerBytes).
scheduler::OpShape ShapeFor(OpKind op, double m, int n) {
  scheduler::OpShape s;
  s.op = op;
  const double elems = m / 4;
  switch (op) {
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
    case OpKind::kAllToAll:
      s.count = static_cast<uint64_t>(std::llround(elems / n));
      break;
    default:
      s.count = static_cast<uint64_t>(std::llround(elems));
  }
  return s;
}

scheduler::CommLayout LayoutFor(const topology::FabricSpec& f) {
  scheduler::CommLayout l = scheduler::CommLayout::Uniform(f.nodes, f.ranks_per_node, f.rails);
  if (f.kind == topology::FabricKind::kTorus) l.torus_dims = f.torus_dims;
  return l;
}

absl::Status RunOp(const ParsedFlags& f) {
  OpKind op;
  if (!scheduler::ParseOpName(f.positional[0], &op) || scheduler::IsPointToPoint(op) ||
      op == OpKind::kAllToAllv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown op '", f.positional[0],
        "' (allreduce, reducescatter, allgather, broadcast, reduce, alltoall, barrier, "
        "crossover, critical-size)"));
  }
  if (f.positional.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", f.positional[1], "'"));
  }
  double m = 0;
  if (op != OpKind::kBarrier) {
    if (!f.Has("size")) return absl::InvalidArgumentError("--size is required");
    absl::StatusOr<double> size = BytesFlag(f, "size", 0);
    if (!size.ok()) return size.status();
    m = *size;
  }
  absl::StatusOr<topology::FabricSpec> fabric = FabricFromFlags(f);
  if (!fabric.ok()) return fabric.status();
  double budget = 2e6;
  if (f.Has("ir-budget") && (!absl::SimpleAtod(f.Get("ir-budget"), &budget) || budget < 0)) {
    return absl::InvalidArgumentError("--ir-budget must be a number of transfers >= 0");
  }
  const int n = fabric->nranks();
  scheduler::cost::TunerOptions options;
  if (absl::Status s = TunerCpuFromFlags(f, &options); !s.ok()) return s;
  if (f.Has("chunks")) {
    options.chunk_sizes.clear();
    for (absl::string_view part : absl::StrSplit(f.Get("chunks"), ',')) {
      absl::StatusOr<double> c = topology::ParseBytes(part);
      if (!c.ok() || *c < 0 || *c > 1e12) {
        return absl::InvalidArgumentError(
            absl::StrCat("--chunks: bad size '", part, "' (sizes such as 0,64KiB,1MiB)"));
      }
      options.chunk_sizes.push_back(static_cast<size_t>(*c));
    }
  }
  options.include_modelled = true;
  options.max_ir_transfers = static_cast<uint64_t>(budget);
  const scheduler::OpShape shape = ShapeFor(op, m, n);
  absl::StatusOr<scheduler::cost::Choice> choice =
      scheduler::cost::Tune(shape, LayoutFor(*fabric), *fabric, options);
  if (!choice.ok()) return choice.status();
  std::vector<scheduler::cost::Candidate> rows = choice->candidates;
  std::string chosen = choice->model_name;
  if (f.Has("algo")) {
    const std::string want = f.Get("algo");
    std::vector<scheduler::cost::Candidate> only;
    for (const auto& c : rows) {
      if (c.name == want || c.generator == want) only.push_back(c);
    }
    if (only.empty()) {
      std::string names;
      for (const auto& c : rows) absl::StrAppend(&names, names.empty() ? "" : ", ", c.name);
      return absl::InvalidArgumentError(absl::StrCat("--algo ", want, " does not apply to ",
                                                     scheduler::OpName(op), " here (", names, ")"));
    }
    rows = only;
    chosen = only[0].name;
  }
  if (f.Bool("json")) {
    nlohmann::json algos = nlohmann::json::array();
    for (const auto& c : rows) {
      nlohmann::json a = {{"name", c.name}};
      if (c.has_closed_form) {
        a["time_s"] = c.closed_form.time_s();
        a["latency_s"] = c.closed_form.latency_s;
        a["bandwidth_s"] = c.closed_form.bandwidth_s;
        a["formula"] = c.closed_form.formula;
      } else {
        a["time_s"] = c.ir_time_s;
      }
      if (c.has_ir) {
        a["ir_time_s"] = c.ir_time_s;
        a["ir_transfers"] = c.ir_transfers;
        a["chunk_bytes"] = c.chunk_bytes;
        a["cpu_s"] = c.cpu_s;
      }
      if (!c.note.empty()) a["note"] = c.note;
      algos.push_back(a);
    }
    nlohmann::json out = {{"op", std::string(scheduler::OpName(op))},
                          {"nranks", n},
                          {"nodes", fabric->nodes},
                          {"ranks_per_node", fabric->ranks_per_node},
                          {"rails", fabric->rails},
                          {"fabric", topology::FabricKindName(fabric->kind)},
                          {"size_bytes", m},
                          {"algorithms", algos},
                          {"chosen", chosen}};
    if (op == OpKind::kAllToAll) {
      const auto b = scheduler::cost::AllToAllLowerBounds(m, *fabric);
      out["bounds"] = {{"per_transfer_s", b.per_transfer_s},
                       {"injection_s", b.injection_s},
                       {"ejection_s", b.ejection_s},
                       {"bisection_s", b.bisection_s},
                       {"lower_bound_s", b.lower_bound_s}};
    }
    std::printf("%s\n", out.dump(2).c_str());
    return absl::OkStatus();
  }
  std::printf("%s of %s on %d ranks (%d nodes x %d, %d rails, %s)\n",
              std::string(scheduler::OpName(op)).c_str(), FormatBytes(m).c_str(), n, fabric->nodes,
              fabric->ranks_per_node, fabric->rails, topology::FabricKindName(fabric->kind));
  TextTable table({"ALGORITHM", "LATENCY", "BANDWIDTH", "CLOSED FORM", "SCHEDULE IR", "NOTE"});
  for (const auto& c : rows) {
    table.AddRow({c.name + (c.name == chosen ? " *" : ""),
                  c.has_closed_form ? FormatDuration(c.closed_form.latency_s) : "-",
                  c.has_closed_form ? FormatDuration(c.closed_form.bandwidth_s) : "-",
                  c.has_closed_form ? FormatDuration(c.closed_form.time_s()) : "-",
                  c.has_ir ? FormatDuration(c.ir_time_s) : "-", c.note.empty() ? "" : c.note});
  }
  std::fputs(table.Render().c_str(), stdout);
  if (op == OpKind::kAllToAll) {
    const auto b = scheduler::cost::AllToAllLowerBounds(m, *fabric);
    std::printf("alltoall bounds: one transfer %s, injection %s, bisection %s -> lower bound %s\n",
                FormatDuration(b.per_transfer_s).c_str(), FormatDuration(b.injection_s).c_str(),
                FormatDuration(b.bisection_s).c_str(), FormatDuration(b.lower_bound_s).c_str());
  }
  std::printf("chosen: %s (%s)\n", chosen.c_str(), choice->reason.c_str());
  return absl::OkStatus();
}

}  // namespace

absl::Status RunModel(const std::vector<std::string>& args) {
  std::set<std::string> values = FabricValueFlags();
  values.insert({"size", "algo", "ir-budget", "chunks"});
  values.insert(std::begin(kTunerCpuFlags), std::end(kTunerCpuFlags));
  std::set<std::string> bools = FabricBoolFlags();
  bools.insert("json");
  absl::StatusOr<ParsedFlags> f = ParseFlags(args, values, bools);
  if (!f.ok()) return f.status();
  if (f->Bool("help")) {
    std::fputs(kUsage, stdout);
    return absl::OkStatus();
  }
  if (f->positional.empty()) {
    return absl::InvalidArgumentError("missing OP (try 'railctl model --help')");
  }
  if (f->positional[0] == "critical-size") return RunCriticalSize(*f);
  if (f->positional[0] == "crossover") return RunCrossover(*f);
  return RunOp(*f);
}

}  // namespace railyard::railctl
