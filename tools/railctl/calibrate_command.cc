#include "tools/railctl/calibrate_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/core/cost_model_proto.h"
#include "daemon/scheduler/cost/calibration.h"
#include "daemon/scheduler/cost/tuner.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/scheduler/sim/jobs_file.h"
#include "daemon/scheduler/sim/simulator.h"
#include "daemon/topology/units.h"
#include "tools/railctl/admin_client.h"
#include "tools/railctl/child_process.h"
#include "tools/railctl/explain_command.h"
#include "tools/railctl/flag_set.h"
#include "tools/railctl/text_table.h"

namespace railyard::railctl {
namespace {

namespace cost = scheduler::cost;
namespace sim = scheduler::sim;
using topology::LinkClass;

constexpr const char* kUsage =
    "usage: railctl calibrate --daemons S0,S1[,...] [--ranks-per-daemon G] [--op OP] [--algo A]\n"
    "                         [-b SIZE] [-e SIZE] [-f N] [-n ITERS] [-w WARMUP] [--perf PATH]\n"
    "                         [--sweeps N] [--timeout SECONDS] [--max-error F] [--dry-run]\n"
    "                         [--json]\n"
    "Runs railyard-perf on the first daemon alone and then across all of them, fits the\n"
    "per-operation overhead, the intra-node bandwidth and the inter-node alpha and beta by least\n"
    "squares on the schedule IR's prediction, prints the fit against every measured size and\n"
    "stores it on every daemon (--state_dir/calibration.json) unless --dry-run. With G = 1 there\n"
    "is no intra-node sweep: the per-operation overhead is fitted with the inter-node figures.\n"
    "Each sweep runs --sweeps times and every size is fitted at its median, so one sweep\n"
    "disturbed by another process does not bend the fit. A fit whose rms relative error over the\n"
    "sizes exceeds --max-error is printed, not stored, and the command fails "
    "(FAILED_PRECONDITION).\n"
    "Defaults: G = 2, allreduce, ring, -b 64K -e 4M -f 4 -n 10 -w 3 --sweeps 3 --max-error 0.5.\n";

// A huge bandwidth and zero latency: a link class that costs nothing.
constexpr LinkClass kFree{0, 1e30};

struct Measured {
  uint64_t bytes = 0;
  double seconds = 0;
};

// railyard-perf's rows: size count type redop root time algbw busbw #wrong (out of place) ...
absl::StatusOr<std::vector<Measured>> ParsePerf(const std::string& out) {
  std::vector<Measured> rows;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipWhitespace())) {
    if (absl::StripLeadingAsciiWhitespace(line).substr(0, 1) == "#") continue;
    std::vector<absl::string_view> cols = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (cols.size() < 9) continue;
    Measured m;
    double us = 0;
    if (!absl::SimpleAtoi(cols[0], &m.bytes) || !absl::SimpleAtod(cols[5], &us)) continue;
    if (cols[8] != "0" && cols[8] != "N/A") {
      return absl::DataLossError(
          absl::StrCat("railyard-perf reports ", cols[8], " wrong elements at ", m.bytes, " B"));
    }
    m.seconds = us * 1e-6;
    rows.push_back(m);
  }
  if (rows.empty()) return absl::InternalError("railyard-perf printed no result rows");
  return rows;
}

// Per size, the median time over repeated sweeps (the upper median of an even count).
absl::StatusOr<std::vector<Measured>> MedianRows(const std::vector<std::vector<Measured>>& runs) {
  std::vector<Measured> out = runs.front();
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<double> t;
    for (const std::vector<Measured>& run : runs) {
      if (run.size() != out.size() || run[i].bytes != out[i].bytes) {
        return absl::InternalError("railyard-perf sweeps measured different sizes");
      }
      t.push_back(run[i].seconds);
    }
    std::sort(t.begin(), t.end());
    out[i].seconds = t[t.size() / 2];
  }
  return out;
}

// The time the simulator predicts for the schedule on a fabric with these link classes.
absl::StatusOr<double> Predict(const scheduler::RankSchedule& schedule,
                               const scheduler::CommLayout& layout, LinkClass intra,
                               LinkClass inter) {
  const topology::FabricSpec f = cost::FabricForLayout(layout, intra, inter, 0);
  absl::StatusOr<sim::JobResult> r = sim::SimulateSchedule(schedule, layout, f);
  if (!r.ok()) return r.status();
  return r->time_s;
}

struct Point {
  Measured m;
  scheduler::RankSchedule schedule;
};

absl::StatusOr<std::vector<Point>> Schedules(const std::vector<Measured>& rows,
                                             scheduler::OpKind op, const std::string& algo,
                                             const scheduler::CommLayout& layout, size_t chunk) {
  std::vector<Point> points;
  for (const Measured& m : rows) {
    scheduler::OpShape shape;
    shape.op = op;
    shape.count = sim::CountForBytes(op, static_cast<double>(m.bytes), layout.nranks);
    absl::StatusOr<scheduler::RankSchedule> s = scheduler::Generate(algo, shape, layout, chunk);
    if (!s.ok()) return s.status();
    points.push_back({m, *std::move(s)});
  }
  return points;
}

std::string PerfSize(const std::string& flag, const ParsedFlags& f, const char* fallback) {
  return f.Has(flag) ? f.Get(flag) : fallback;
}

}  // namespace

absl::Status RunCalibrate(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedFlags> f =
      ParseFlags(args,
                 {"daemons", "ranks-per-daemon", "op", "algo", "b", "e", "f", "n", "w", "perf",
                  "timeout", "sweeps", "max-error"},
                 {"dry-run", "json"});
  if (!f.ok()) return f.status();
  if (f->Bool("help")) {
    std::fputs(kUsage, stdout);
    return absl::OkStatus();
  }
  if (!f->positional.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", f->positional[0], "'"));
  }
  if (!f->Has("daemons")) return absl::InvalidArgumentError("--daemons S0,S1,... is required");
  const std::vector<std::string> daemons =
      absl::StrSplit(f->Get("daemons"), ',', absl::SkipEmpty());
  if (daemons.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--daemons '", f->Get("daemons"), "' names no daemon socket"));
  }
  for (size_t i = 0; i < daemons.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      // One daemon twice would be measured as two nodes whose "inter-node" link is its memory.
      if (daemons[i] == daemons[j]) {
        return absl::InvalidArgumentError(
            absl::StrCat("--daemons names ", daemons[i], " twice: one socket per node"));
      }
    }
  }
  absl::StatusOr<int> g = IntFlag(*f, "ranks-per-daemon", 2, 1);
  if (!g.ok()) return g.status();
  if (daemons.size() == 1 && *g == 1) {
    // Nothing would be measured: no pair of ranks on the node, no pair of nodes.
    return absl::InvalidArgumentError(
        "one daemon with one rank has no link to measure: give --ranks-per-daemon 2 or more "
        "(the intra-node fit), or two or more --daemons (the inter-node fit)");
  }
  absl::StatusOr<int> timeout = IntFlag(*f, "timeout", 300, 10);
  if (!timeout.ok()) return timeout.status();
  absl::StatusOr<int> sweeps = IntFlag(*f, "sweeps", 3, 1);
  if (!sweeps.ok()) return sweeps.status();
  double max_error = 0.5;
  if (f->Has("max-error") && (!absl::SimpleAtod(f->Get("max-error"), &max_error) ||
                              !(max_error >= 0) || !std::isfinite(max_error))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-error must be a fraction >= 0, such as 0.5 for 50 % (got '",
                     f->Get("max-error"), "')"));
  }
  const std::string op_name = f->Get("op", "allreduce");
  scheduler::OpKind op;
  if (!scheduler::ParseOpName(op_name, &op) || scheduler::IsPointToPoint(op) ||
      op == scheduler::OpKind::kAllToAllv || op == scheduler::OpKind::kBarrier) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--op ", op_name, ": allreduce, reducescatter, allgather, broadcast, reduce or alltoall"));
  }
  const std::string algo = f->Get("algo", scheduler::kAlgoRing);

  // Who is calibrated: every daemon's name, rails and chunk size.
  std::vector<std::string> names;
  int rails = 1 << 30;
  size_t chunk = 256 * 1024;
  size_t paced_chunk = 0;
  for (const std::string& socket : daemons) {
    absl::StatusOr<v1::StatusResponse> st = AdminClient(socket).Status();
    if (!st.ok()) return st.status();
    names.push_back(st->node_name());
    rails = std::min(rails, std::max(1, st->rails_size()));
    if (st->chunk_bytes() > 0) chunk = st->chunk_bytes();
    if (st->paced_chunk_bytes() > 0) {
      paced_chunk = paced_chunk == 0 ? st->paced_chunk_bytes()
                                     : std::min<size_t>(paced_chunk, st->paced_chunk_bytes());
    }
  }
  // Paced rails cap every multi-node chunk at the smallest cap of the nodes (as the daemons'
  // planners do): a 200 Mbit/s fabric runs 32 KiB chunks, and modelling 256 KiB ones mispredicted
  // hier by -18 % / +26 % at 64 / 256 KiB.
  if (paced_chunk > 0 && paced_chunk < chunk) chunk = paced_chunk;
  const int k = static_cast<int>(daemons.size());
  const std::string perf = f->Get("perf", SiblingProgram("railyard-perf"));
  const auto run_perf = [&](const std::vector<std::string>& sockets,
                            const std::string& forced) -> absl::StatusOr<std::vector<Measured>> {
    std::vector<std::string> argv = {perf,
                                     "--op",
                                     op_name,
                                     "--daemons",
                                     absl::StrJoin(sockets, ","),
                                     "--ranks-per-daemon",
                                     absl::StrCat(*g),
                                     "-b",
                                     PerfSize("b", *f, "64K"),
                                     "-e",
                                     PerfSize("e", *f, "4M"),
                                     "-f",
                                     f->Get("f", "4"),
                                     "-n",
                                     f->Get("n", "10"),
                                     "-w",
                                     f->Get("w", "3"),
                                     "-c",
                                     "1",
                                     "--deadline_s",
                                     absl::StrCat(*timeout)};
    std::map<std::string, std::string> env;
    env["RAILYARD_ALGO"] = forced;
    std::vector<std::vector<Measured>> runs;
    for (int i = 0; i < *sweeps; ++i) {
      absl::StatusOr<std::string> out =
          RunToCompletion(argv, env, std::chrono::seconds(*timeout + 10));
      if (!out.ok()) return out.status();
      absl::StatusOr<std::vector<Measured>> rows = ParsePerf(*out);
      if (!rows.ok()) return rows.status();
      runs.push_back(*std::move(rows));
    }
    return MedianRows(runs);
  };

  cost::Calibration fit = cost::Calibration::Defaults();
  fit.source = "fit";
  // Step 1: one daemon, G ranks: the local plan is a direct (all-pairs) schedule in memory.
  const scheduler::CommLayout one_node = scheduler::CommLayout::Uniform(1, *g, rails);
  std::vector<Measured> intra_rows;
  if (*g >= 2) {
    absl::StatusOr<std::vector<Measured>> rows = run_perf({daemons[0]}, "");
    if (!rows.ok()) return rows.status();
    intra_rows = *rows;
    absl::StatusOr<std::vector<Point>> pts =
        Schedules(intra_rows, op, scheduler::kAlgoDirect, one_node, 0);
    if (!pts.ok()) return pts.status();
    std::vector<cost::Sample> samples;
    for (const Point& p : *pts) {
      // T = op_overhead + intra alpha * steps (held at its default) + bytes / intra beta.
      absl::StatusOr<double> lat = Predict(p.schedule, one_node, {fit.intra.alpha_s, 1e30}, kFree);
      absl::StatusOr<double> bytes = Predict(p.schedule, one_node, {0, 1}, kFree);
      if (!lat.ok()) return lat.status();
      if (!bytes.ok()) return bytes.status();
      const double y = p.m.seconds - *lat;
      if (y > 0) samples.push_back({1, *bytes, y});
    }
    absl::StatusOr<cost::LinearFit> lf = cost::FitLinkClass(samples);
    if (!lf.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("intra-node fit on ", names[0], ": ", lf.status().message()));
    }
    fit.op_overhead_s = lf->link.alpha_s;
    fit.intra.beta_bytes_per_s = lf->link.beta_bytes_per_s;
  }
  // Step 2: all daemons, the forced algorithm: inter alpha and beta with the intra part held.
  const scheduler::CommLayout layout = scheduler::CommLayout::Uniform(k, *g, rails);
  std::vector<Measured> rows = intra_rows;
  scheduler::CommLayout check_layout = one_node;
  std::string check_algo = scheduler::kAlgoDirect;
  size_t check_chunk = 0;
  if (k >= 2) {
    absl::StatusOr<std::vector<Measured>> inter_rows = run_perf(daemons, algo);
    if (!inter_rows.ok()) return inter_rows.status();
    absl::StatusOr<std::vector<Point>> pts = Schedules(*inter_rows, op, algo, layout, chunk);
    if (!pts.ok()) return pts.status();
    // With one rank per daemon there was no intra-node sweep to measure the per-operation
    // overhead: it is fitted here, with the inter-node alpha and beta. (Held at the built-in
    // default instead, 300 us, it made every small size's time negative after subtraction, and
    // the fit of what was left predicted 300 us at every size.)
    const bool fit_overhead = intra_rows.empty();
    std::vector<cost::Sample> samples;
    for (const Point& p : *pts) {
      absl::StatusOr<double> intra_part = Predict(p.schedule, layout, fit.intra, kFree);
      absl::StatusOr<double> lat = Predict(p.schedule, layout, kFree, {1, 1e30});
      absl::StatusOr<double> bytes = Predict(p.schedule, layout, kFree, {0, 1});
      if (!intra_part.ok()) return intra_part.status();
      if (!lat.ok()) return lat.status();
      if (!bytes.ok()) return bytes.status();
      const double y = p.m.seconds - (fit_overhead ? 0 : fit.op_overhead_s) - *intra_part;
      if (y > 0) samples.push_back({*lat, *bytes, y});
    }
    absl::StatusOr<cost::LinearFit> lf =
        fit_overhead ? cost::FitLinkClassWithOverhead(samples) : cost::FitLinkClass(samples);
    if (!lf.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("inter-node fit over ", k, " daemons: ", lf.status().message()));
    }
    if (fit_overhead) fit.op_overhead_s = lf->overhead_s;
    // The linear fit adds the intra and inter parts; the simulator overlaps them along the
    // critical path. Refine alpha and beta (and the overhead it fitted) against the full
    // prediction (what explain and the tuner use): a pattern search in log space minimising the
    // squared relative error.
    struct Figures {
      LinkClass inter;
      double op_overhead_s;
    };
    const auto objective = [&](const Figures& x) {
      double e = 0;
      for (const Point& p : *pts) {
        absl::StatusOr<double> t = Predict(p.schedule, layout, fit.intra, x.inter);
        if (!t.ok()) return 1e300;
        const double r = (*t + x.op_overhead_s - p.m.seconds) / p.m.seconds;
        e += r * r;
      }
      return e;
    };
    Figures best{lf->link, fit.op_overhead_s};
    best.inter.alpha_s = std::max(best.inter.alpha_s, 1e-7);
    if (fit_overhead) best.op_overhead_s = std::max(best.op_overhead_s, 1e-7);
    double best_e = objective(best);
    const int dims = fit_overhead ? 3 : 2;
    for (double step = 1.0; step > 0.005;) {
      bool improved = false;
      for (int dim = 0; dim < dims; ++dim) {
        for (double dir : {1.0, -1.0}) {
          Figures trial = best;
          double& v = dim == 0   ? trial.inter.alpha_s
                      : dim == 1 ? trial.inter.beta_bytes_per_s
                                 : trial.op_overhead_s;
          v *= std::exp(dir * step);
          const double e = objective(trial);
          if (e < best_e) {
            best = trial;
            best_e = e;
            improved = true;
          }
        }
      }
      if (!improved) step /= 2;
    }
    fit.inter = best.inter;
    fit.op_overhead_s = best.op_overhead_s;
    rows = *inter_rows;
    check_layout = layout;
    check_algo = algo;
    check_chunk = chunk;
  }
  fit.overhead_s = 0;  // folded into the fitted alphas
  // Step 3: the fitted model against every measured size of the last sweep.
  absl::StatusOr<std::vector<Point>> pts =
      Schedules(rows, op, check_algo, check_layout, check_chunk);
  if (!pts.ok()) return pts.status();
  struct Check {
    uint64_t bytes;
    double measured, predicted, error;
  };
  std::vector<Check> checks;
  double sq = 0, worst = 0;
  size_t worst_at = 0;  // the check with the largest |error|
  for (const Point& p : *pts) {
    absl::StatusOr<double> t = Predict(p.schedule, check_layout, fit.intra, fit.inter);
    if (!t.ok()) return t.status();
    const double predicted = *t + fit.op_overhead_s;
    const double error = (predicted - p.m.seconds) / p.m.seconds;
    if (std::fabs(error) > worst) {
      worst = std::fabs(error);
      worst_at = checks.size();
    }
    checks.push_back({p.m.bytes, p.m.seconds, predicted, error});
    sq += error * error;
  }
  fit.samples = static_cast<int>(checks.size());
  fit.rms_relative_error = checks.empty() ? 0 : std::sqrt(sq / checks.size());
  fit.op = std::string(scheduler::OpName(op));
  fit.algorithm = k >= 2 ? algo : "local";
  fit.nranks = k * *g;
  fit.nnodes = k;
  fit.placement = absl::StrCat(k, " daemons x ", *g, " ranks, daemon-major, rank i on rail i mod ",
                               rails, ", chunks of ", check_chunk, " B");
  fit.topology = absl::StrJoin(names, ",");
  fit.fitted_at = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  if (absl::Status s = cost::Validate(fit); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("the fit is not usable: ", s.message()));
  }
  // A fit this far off would steer every daemon's tuner by figures no size measured: printed
  // so that the operator sees where it misses, never stored.
  absl::Status refused;
  if (fit.rms_relative_error > max_error) {
    const Check* w = &checks[worst_at];
    refused = absl::FailedPreconditionError(absl::StrFormat(
        "the fit misses the measured times by %.1f %% rms (worst %+.1f %% at %s), over "
        "--max-error %g: not stored; measure again with more iterations (-n) or sweeps, on a "
        "quieter host",
        100 * fit.rms_relative_error, 100 * w->error,
        topology::FormatBytes(static_cast<double>(w->bytes)), max_error));
  }
  std::vector<std::string> stored;
  const v1::CostModel model = ToProto(fit);
  if (!f->Bool("dry-run") && refused.ok()) {
    for (const std::string& socket : daemons) {
      absl::StatusOr<std::string> path = AdminClient(socket).SetCalibration(model);
      if (!path.ok()) return path.status();
      stored.push_back(*path);
    }
  }
  if (f->Bool("json")) {
    nlohmann::json sizes = nlohmann::json::array();
    for (const Check& c : checks) {
      sizes.push_back({{"bytes", c.bytes},
                       {"measured_s", c.measured},
                       {"predicted_s", c.predicted},
                       {"error", c.error}});
    }
    nlohmann::json out = {
        {"intra",
         {{"alpha_s", fit.intra.alpha_s}, {"beta_bytes_per_s", fit.intra.beta_bytes_per_s}}},
        {"inter",
         {{"alpha_s", fit.inter.alpha_s}, {"beta_bytes_per_s", fit.inter.beta_bytes_per_s}}},
        {"op_overhead_s", fit.op_overhead_s},
        {"op", fit.op},
        {"algorithm", fit.algorithm},
        {"placement", fit.placement},
        {"topology", fit.topology},
        {"sizes", sizes},
        {"rms_error", fit.rms_relative_error},
        {"max_error", worst},
        {"stored", stored}};
    std::printf("%s\n", out.dump(2).c_str());
    return refused;
  }
  TextTable table({"SIZE", "MEASURED", "PREDICTED", "ERROR"});
  for (const Check& c : checks) {
    table.AddRow({topology::FormatBytes(static_cast<double>(c.bytes)),
                  topology::FormatDuration(c.measured), topology::FormatDuration(c.predicted),
                  absl::StrFormat("%+.1f%%", 100 * c.error)});
  }
  std::printf("%s/%s on %s\n", fit.op.c_str(), fit.algorithm.c_str(), fit.placement.c_str());
  std::fputs(table.Render().c_str(), stdout);
  std::printf("fit: %s\nworst error %.1f%%\n", DescribeCostModel(model).c_str(), 100 * worst);
  if (!refused.ok()) {
    std::printf("not stored (rms error over --max-error)\n");
  } else if (stored.empty()) {
    std::printf("not stored (--dry-run)\n");
  } else {
    std::printf("stored: %s\n", absl::StrJoin(stored, ", ").c_str());
  }
  return refused;
}

}  // namespace railyard::railctl
