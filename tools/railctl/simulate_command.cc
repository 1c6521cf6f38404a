#include "tools/railctl/simulate_command.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/scheduler/cost/closed_form.h"
#include "daemon/scheduler/cost/tuner.h"
#include "daemon/scheduler/op.h"
#include "daemon/scheduler/sim/jobs_file.h"
#include "daemon/scheduler/sim/simulator.h"
#include "daemon/topology/topology_file.h"
#include "daemon/topology/units.h"
#include "tools/railctl/fabric_flags.h"
#include "tools/railctl/flag_set.h"
#include "tools/railctl/text_table.h"

namespace railyard::railctl {
namespace {

namespace sim = scheduler::sim;

constexpr const char* kUsage =
    "usage: railctl simulate (--topology FILE | --nranks N [--ranks-per-node G] [--rails R]\n"
    "                         --alpha T --beta BW [--alpha-intra T] [--beta-intra BW]\n"
    "                         [--overhead T] [--torus XxY[xZ]] [--in-network])\n"
    "                        [--nodes-per-rack P --oversubscription R]\n"
    "                        --op OP --size SIZE [--algo A] [--chunk SIZE] [--root R]\n"
    "                        [--jobs FILE] [--links] [--ir-budget TRANSFERS]\n"
    "                        [--message-cpu T] [--reduce-bw BW] [--json]\n"
    "Runs the schedule IR the daemons would execute through the fabric simulator (alpha-beta\n"
    "links, bandwidth shared by the flows on a link, oversubscribed spines). --jobs FILE runs\n"
    "several jobs at once on the fabric (docs/simulation.md); --links lists every link used.\n"
    "Without --algo the tuner picks algorithm and chunk size, as the daemons would (schedule IR\n"
    "predictions up to --ir-budget transfers per candidate, default 2000000, as railctl model;\n"
    "--message-cpu and --reduce-bw as in railctl model).\n";

nlohmann::json TiersJson(const std::vector<sim::TierStats>& tiers) {
  nlohmann::json out = nlohmann::json::array();
  for (const sim::TierStats& t : tiers) {
    out.push_back({{"tier", t.tier}, {"bytes", t.bytes}, {"messages", t.messages}});
  }
  return out;
}

nlohmann::json LinkJson(const sim::LinkStats& l, double time_s) {
  return {{"name", l.name},
          {"tier", l.tier},
          {"bytes", l.bytes},
          {"busy_s", l.busy_s},
          {"utilization", time_s > 0 ? l.busy_s / time_s : 0.0}};
}

// Fills in the algorithm (and chunk size, unless given) of jobs that name none: the tuner's pick
// for the job's layout, with IR
// predictions only where schedules are small (the simulation itself is the expensive part).
absl::Status ResolveAlgorithms(const topology::FabricSpec& fabric, uint64_t ir_budget,
                               const scheduler::cost::TunerOptions& cpu,
                               std::vector<sim::JobSpec>* jobs, std::vector<std::string>* reasons) {
  for (sim::JobSpec& job : *jobs) {
    if (!job.algorithm.empty()) {
      reasons->push_back("given");
      continue;
    }
    scheduler::cost::TunerOptions options;
    // A chunk size the job gives is kept; otherwise the tuner picks one too.
    if (job.chunk_bytes != 0) options.chunk_sizes = {job.chunk_bytes};
    options.max_ir_transfers = ir_budget;
    options.message_cpu_s = cpu.message_cpu_s;
    options.reduce_bytes_per_s = cpu.reduce_bytes_per_s;
    options.include_modelled = false;
    const scheduler::CommLayout layout = sim::JobLayout(fabric, job);
    topology::FabricSpec job_fabric = fabric;
    absl::StatusOr<scheduler::cost::Choice> choice =
        scheduler::cost::Tune(job.shape, layout, job_fabric, options);
    if (!choice.ok()) {
      return absl::Status(choice.status().code(),
                          absl::StrCat("job ", job.name, ": ", choice.status().message()));
    }
    job.algorithm = choice->algorithm;
    job.chunk_bytes = choice->chunk_bytes;
    reasons->push_back(absl::StrCat("tuner: ", choice->reason));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunSimulate(const std::vector<std::string>& args) {
  std::set<std::string> values = FabricValueFlags();
  values.insert({"op", "size", "algo", "chunk", "root", "jobs", "ir-budget"});
  values.insert(std::begin(kTunerCpuFlags), std::end(kTunerCpuFlags));
  std::set<std::string> bools = FabricBoolFlags();
  bools.insert({"json", "links"});
  absl::StatusOr<ParsedFlags> f = ParseFlags(args, values, bools);
  if (!f.ok()) return f.status();
  if (f->Bool("help")) {
    std::fputs(kUsage, stdout);
    return absl::OkStatus();
  }
  if (!f->positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", f->positional[0], "' (the op goes in --op)"));
  }
  absl::StatusOr<topology::FabricSpec> fabric = FabricFromFlags(*f);
  if (!fabric.ok()) return fabric.status();
  if (absl::Status s = sim::CheckFabric(*fabric); !s.ok()) return s;

  std::vector<sim::JobSpec> jobs;
  if (f->Has("jobs")) {
    if (f->Has("op") || f->Has("size") || f->Has("algo")) {
      return absl::InvalidArgumentError("--jobs describes the jobs: drop --op/--size/--algo");
    }
    absl::StatusOr<std::string> text = topology::ReadTextFile(f->Get("jobs"), "jobs file");
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<sim::JobSpec>> parsed = sim::ParseJobsJson(*text, *fabric);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(f->Get("jobs"), ": ", parsed.status().message()));
    }
    jobs = *std::move(parsed);
  } else {
    if (!f->Has("op")) return absl::InvalidArgumentError("--op is required (or --jobs FILE)");
    scheduler::OpKind op;
    if (!scheduler::ParseOpName(f->Get("op"), &op) || scheduler::IsPointToPoint(op) ||
        op == scheduler::OpKind::kAllToAllv) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown op '", f->Get("op"),
          "' (allreduce, reducescatter, allgather, broadcast, reduce, alltoall, barrier)"));
    }
    double bytes = 0;
    if (op != scheduler::OpKind::kBarrier) {
      if (!f->Has("size")) return absl::InvalidArgumentError("--size is required");
      absl::StatusOr<double> size = BytesFlag(*f, "size", 0);
      if (!size.ok()) return size.status();
      bytes = *size;
    }
    sim::JobSpec job;
    job.name = "job0";
    job.shape.op = op;
    job.shape.count = sim::CountForBytes(op, bytes, fabric->nranks());
    absl::StatusOr<int> root = IntFlag(*f, "root", 0, 0);
    if (!root.ok()) return root.status();
    job.shape.root = *root;
    job.algorithm = f->Get("algo");
    absl::StatusOr<double> chunk = BytesFlag(*f, "chunk", 0);
    if (!chunk.ok()) return chunk.status();
    job.chunk_bytes = static_cast<size_t>(*chunk);
    jobs.push_back(job);
  }
  // The tuner's budget, as in railctl model, so that both pick the same algorithm.
  double budget = 2e6;
  if (f->Has("ir-budget") && (!absl::SimpleAtod(f->Get("ir-budget"), &budget) || budget < 0)) {
    return absl::InvalidArgumentError("--ir-budget must be a number of transfers >= 0");
  }
  scheduler::cost::TunerOptions cpu;
  if (absl::Status s = TunerCpuFromFlags(*f, &cpu); !s.ok()) return s;
  std::vector<std::string> reasons;
  if (absl::Status s =
          ResolveAlgorithms(*fabric, static_cast<uint64_t>(budget), cpu, &jobs, &reasons);
      !s.ok()) {
    return s;
  }
  sim::SimOptions options;
  options.all_links = f->Bool("links");
  absl::StatusOr<sim::SimResult> r = sim::Simulate(*fabric, jobs, options);
  if (!r.ok()) return r.status();

  if (f->Bool("json")) {
    nlohmann::json job_list = nlohmann::json::array();
    for (size_t i = 0; i < r->jobs.size(); ++i) {
      const sim::JobResult& j = r->jobs[i];
      nlohmann::json jj = {{"name", j.name},
                           {"algorithm", j.algorithm},
                           {"time_s", j.time_s},
                           {"transfers", j.transfers},
                           {"tiers", TiersJson(j.tiers)},
                           {"why", i < reasons.size() ? reasons[i] : ""}};
      job_list.push_back(jj);
    }
    nlohmann::json out = {
        {"time_s", r->time_s},
        {"algorithm", r->jobs.size() == 1 ? r->jobs[0].algorithm : std::string("(several)")},
        {"fabric", topology::FabricKindName(fabric->kind)},
        {"nodes", fabric->nodes},
        {"ranks_per_node", fabric->ranks_per_node},
        {"rails", fabric->rails},
        {"tiers", TiersJson(r->tiers)},
        {"busiest_link", LinkJson(r->busiest_link, r->time_s)},
        {"transfers", r->transfers},
        {"wall_s", r->wall_s},
        {"jobs", job_list}};
    if (jobs.size() == 1 && jobs[0].shape.op != scheduler::OpKind::kBarrier) {
      // The closed form of the same algorithm, for comparison (PRIMER's M).
      absl::StatusOr<std::vector<scheduler::cost::Estimate>> forms = scheduler::cost::ClosedForms(
          jobs[0].shape.op, scheduler::cost::PrimerBytes(jobs[0].shape, fabric->nranks()), *fabric);
      const std::string want =
          jobs[0].algorithm == scheduler::kAlgoTree ? "dbtree" : jobs[0].algorithm;
      if (forms.ok()) {
        for (const auto& e : *forms) {
          if (e.algorithm == want) out["closed_form_s"] = e.time_s();
        }
      }
    }
    if (options.all_links) {
      nlohmann::json links = nlohmann::json::array();
      for (const sim::LinkStats& l : r->links) links.push_back(LinkJson(l, r->time_s));
      out["links"] = links;
    }
    std::printf("%s\n", out.dump(2).c_str());
    return absl::OkStatus();
  }
  std::printf("fabric: %s, %d nodes x %d ranks, %d rails; %llu transfers simulated in %.2f s\n",
              topology::FabricKindName(fabric->kind), fabric->nodes, fabric->ranks_per_node,
              fabric->rails, static_cast<unsigned long long>(r->transfers), r->wall_s);
  TextTable job_table({"JOB", "ALGORITHM", "TIME", "TRANSFERS", "WHY"});
  for (size_t i = 0; i < r->jobs.size(); ++i) {
    const sim::JobResult& j = r->jobs[i];
    job_table.AddRow({j.name, j.algorithm, topology::FormatDuration(j.time_s),
                      absl::StrCat(j.transfers), i < reasons.size() ? reasons[i] : ""});
  }
  std::fputs(job_table.Render().c_str(), stdout);
  TextTable tiers({"TIER", "BYTES", "MESSAGES"});
  for (const sim::TierStats& t : r->tiers) {
    tiers.AddRow(
        {t.tier, topology::FormatBytes(static_cast<double>(t.bytes)), absl::StrCat(t.messages)});
  }
  std::fputs(tiers.Render().c_str(), stdout);
  std::printf("predicted time %s; busiest link %s (%s, %s, busy %.0f%% of the time)\n",
              topology::FormatDuration(r->time_s).c_str(), r->busiest_link.name.c_str(),
              r->busiest_link.tier.c_str(),
              topology::FormatBytes(static_cast<double>(r->busiest_link.bytes)).c_str(),
              r->time_s > 0 ? 100 * r->busiest_link.busy_s / r->time_s : 0.0);
  if (options.all_links) {
    TextTable links({"LINK", "TIER", "BYTES", "BUSY"});
    for (const sim::LinkStats& l : r->links) {
      links.AddRow({l.name, l.tier, topology::FormatBytes(static_cast<double>(l.bytes)),
                    topology::FormatDuration(l.busy_s)});
    }
    std::fputs(links.Render().c_str(), stdout);
  }
  return absl::OkStatus();
}

}  // namespace railyard::railctl
