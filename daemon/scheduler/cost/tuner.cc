#include "daemon/scheduler/cost/tuner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/kernels/types.h"
#include "daemon/scheduler/algorithms/algorithms.h"
#include "daemon/scheduler/sim/simulator.h"
#include "daemon/topology/units.h"

namespace railyard::scheduler::cost {
namespace {

struct ModelAlgo {
  const char* name;
  const char* generator;  // nullptr: modelled only
};

// Fixed order: ties go to the earlier one (latency-optimal trees before rings).
constexpr ModelAlgo kModelAlgos[] = {
    {"dbtree", kAlgoTree},   {"tree", nullptr},   {"rhd", kAlgoRhd},
    {"rd", kAlgoRd},         {"ring", kAlgoRing}, {"hier", kAlgoHier},
    {"direct", kAlgoDirect}, {"torus", "torus"},  {"innetwork", nullptr},
};

// TunerOptions::message_cpu_s and reduce_bytes_per_s: the CPU of the schedule's busiest rank.
double BusiestRankCpu(const RankSchedule& schedule, const CommLayout& layout,
                      const TunerOptions& options) {
  if (options.message_cpu_s <= 0 && options.reduce_bytes_per_s <= 0) return 0;
  const double per_byte = options.reduce_bytes_per_s > 0 ? 1 / options.reduce_bytes_per_s : 0;
  std::vector<double> cpu(layout.node_of_rank.size(), 0);
  for (const Transfer& t : schedule.transfers) {
    const auto src = static_cast<size_t>(t.src.rank);
    const auto dst = static_cast<size_t>(t.dst.rank);
    if (src >= cpu.size() || dst >= cpu.size()) continue;
    const bool inter = layout.node_of_rank[src] != layout.node_of_rank[dst];
    if (inter) {
      cpu[src] += options.message_cpu_s;
      cpu[dst] += options.message_cpu_s;
    }
    // The reductions the simulator gives no time: of bytes from another node (their transfer is
    // the link's) and a rank's own (a scratch slot a peer filled, reduced into place). One rank
    // reducing another's bytes on the same node is a memory step, priced as such.
    if (t.kind == Transfer::Kind::kReduce && (inter || src == dst)) {
      cpu[dst] += static_cast<double>(t.bytes) * per_byte;
    }
  }
  return cpu.empty() ? 0 : *std::max_element(cpu.begin(), cpu.end());
}

std::string ShapeKey(const OpShape& s) {
  return absl::StrCat(static_cast<int>(s.op), "|", static_cast<int>(s.dtype), "|",
                      static_cast<int>(s.red_op), "|", s.count, "|", s.root);
}

}  // namespace

double PrimerBytes(const OpShape& shape, int nranks) {
  return MessageBytes(shape.op, shape.dtype, shape.count, nranks, &shape.a2av_counts);
}

topology::FabricSpec FabricForLayout(const CommLayout& layout, const topology::LinkClass& intra,
                                     const topology::LinkClass& inter, double overhead_s) {
  topology::FabricSpec f;
  int g = 1;
  for (const auto& ranks : layout.ranks_of_node) g = std::max<int>(g, ranks.size());
  f.nodes = std::max(1, layout.nnodes);
  f.ranks_per_node = g;
  f.rails = std::max(1, layout.rails);
  f.kind = g == 1 ? topology::FabricKind::kFlat
                  : (f.rails > 1 ? topology::FabricKind::kRailOptimized
                                 : topology::FabricKind::kTwoTier);
  f.intra = intra;
  f.inter = inter;
  f.overhead_s = overhead_s;
  return f;
}

absl::StatusOr<Choice> Tune(const OpShape& shape, const CommLayout& layout,
                            const topology::FabricSpec& fabric, const TunerOptions& options) {
  const double m = PrimerBytes(shape, layout.nranks);
  std::vector<Estimate> forms;
  if (!IsPointToPoint(shape.op)) {
    absl::StatusOr<std::vector<Estimate>> f = ClosedForms(shape.op, m, fabric);
    if (!f.ok()) return f.status();
    forms = *std::move(f);
  }
  const uint64_t msg_bytes = shape.count * kernels::ElementSize(shape.dtype);
  std::vector<Candidate> candidates;
  // One node: the daemon lowers the op to its single-pass multi-input kernels ("local"), which
  // read every input once and write every output once. A schedule on one node makes a pass
  // through memory per step, which the link model of the fabric does not see, so local is the
  // choice and the schedules are listed with their closed forms only (and cost no simulation).
  const bool one_node = layout.nnodes <= 1 && !IsPointToPoint(shape.op);
  if (one_node) {
    Candidate c;
    c.name = kAlgoLocal;
    c.generator = kAlgoLocal;
    c.has_closed_form = true;
    c.closed_form.algorithm = kAlgoLocal;
    c.closed_form.latency_s = fabric.intra.alpha_s;
    c.closed_form.bandwidth_s =
        fabric.intra.beta_bytes_per_s > 0 ? m / fabric.intra.beta_bytes_per_s : 0;
    c.closed_form.formula = "alpha_intra + M / beta_intra (one pass over the ranks' buffers)";
    c.note = "single-pass multi-input kernels; the tuner's choice on one node";
    candidates.push_back(std::move(c));
  }
  for (const ModelAlgo& a : kModelAlgos) {
    Candidate c;
    c.name = a.name;
    for (const Estimate& e : forms) {
      if (e.algorithm == a.name) {
        c.has_closed_form = true;
        c.closed_form = e;
      }
    }
    const algorithms::AlgorithmInfo* info =
        a.generator != nullptr ? algorithms::FindAlgorithm(a.generator) : nullptr;
    const bool executable = info != nullptr && algorithms::Implements(*info, shape.op);
    if (executable) c.generator = a.generator;
    if (!executable && !(options.include_modelled && c.has_closed_form)) continue;
    if (executable && one_node) {
      c.note = "one node: closed form only (local is chosen)";
      if (!c.has_closed_form) continue;
    } else if (executable) {
      // Best chunk size by IR prediction, within the transfer budget.
      std::string why;
      std::vector<size_t> tried;
      struct ChunkTime {
        size_t chunk;
        double time_s;
        uint64_t transfers;
        double cpu_s;
      };
      std::vector<ChunkTime> tried_times;
      for (size_t requested : options.chunk_sizes) {
        // A chunk at least as large as the message is the unchunked schedule.
        const size_t chunk = requested >= msg_bytes ? 0 : requested;
        if (std::find(tried.begin(), tried.end(), chunk) != tried.end()) continue;
        tried.push_back(chunk);
        const uint64_t estimate = sim::EstimateTransfers(a.generator, shape, layout, chunk);
        if (estimate > options.max_ir_transfers) {
          why = absl::StrCat("schedule of ~", estimate, " transfers is over the budget of ",
                             options.max_ir_transfers, ": closed form");
          continue;
        }
        absl::StatusOr<RankSchedule> schedule = Generate(a.generator, shape, layout, chunk);
        if (!schedule.ok()) {
          why = std::string(schedule.status().message());
          break;  // the layout does not fit the algorithm, whatever the chunk size
        }
        absl::StatusOr<sim::JobResult> r = sim::SimulateSchedule(*schedule, layout, fabric);
        if (!r.ok()) {
          why = std::string(r.status().message());
          break;
        }
        const double cpu = BusiestRankCpu(*schedule, layout, options);
        tried_times.push_back({chunk, r->time_s + cpu, r->transfers, cpu});
      }
      const bool any = !tried_times.empty();
      if (any) {
        // The best prediction, or the largest chunk predicted within the tolerance of it
        // (TunerOptions::chunk_tie_tolerance).
        const ChunkTime* best = &tried_times.front();
        for (const ChunkTime& t : tried_times) {
          if (t.time_s < best->time_s) best = &t;
        }
        // An unchunked best stays (it is the largest), but unchunked is never a tie's pick: the
        // model does not price the copies and reductions a chunked schedule overlaps with its
        // transfers, and an unchunked one runs after them.
        const ChunkTime* pick = best;
        for (const ChunkTime& t : tried_times) {
          if (t.chunk == 0 || t.time_s > best->time_s * (1 + options.chunk_tie_tolerance)) continue;
          if (pick->chunk != 0 && t.chunk > pick->chunk) pick = &t;
        }
        c.ir_time_s = pick->time_s;
        c.ir_transfers = pick->transfers;
        c.cpu_s = pick->cpu_s;
        c.chunk_bytes = pick->chunk;
      }
      c.has_ir = any;
      if (!any) {
        c.note = why;
        // Not runnable on this layout (e.g. hier on uneven nodes) and no closed form either.
        if (!c.has_closed_form) continue;
        if (why.find("budget") == std::string::npos) {
          c.generator.clear();  // Generate refused the layout: not a candidate for the daemon
          if (!options.include_modelled) continue;
        }
      }
    } else {
      c.note = a.generator == nullptr
                   ? (c.name == "tree" ? "closed form only: the scheduler's tree is the pipelined "
                                         "double binary tree (dbtree)"
                                       : "modelled only: switches reduce, daemons cannot run it")
                   : "closed form only";
    }
    candidates.push_back(std::move(c));
  }
  // innetwork has no generator but the simulator models it: IR-style prediction via Simulate.
  for (Candidate& c : candidates) {
    if (c.name != "innetwork" || c.has_ir) continue;
    sim::JobSpec job;
    job.name = "innetwork";
    job.shape = shape;
    job.algorithm = sim::kAlgoInNetwork;
    if (sim::EstimateTransfers(sim::kAlgoInNetwork, shape, layout, 0) <= options.max_ir_transfers) {
      absl::StatusOr<sim::SimResult> r = sim::Simulate(fabric, {job});
      if (r.ok() && !r->jobs.empty()) {
        c.has_ir = true;
        c.ir_time_s = r->jobs[0].time_s;
        c.ir_transfers = r->jobs[0].transfers;
      }
    }
  }
  if (candidates.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no algorithm implements ", OpName(shape.op),
                                                   " on ", layout.nranks, " ranks"));
  }
  // The choice: cheapest among the executable (the daemon's) or all listed (modelling).
  const Candidate* best = nullptr;
  const Candidate* second = nullptr;
  for (const Candidate& c : candidates) {
    if (c.generator.empty() && !options.include_modelled) continue;
    // On one node local, listed first, is the choice whatever the others predict.
    const bool pinned = one_node && best == &candidates.front();
    if (!pinned && (best == nullptr || c.time_s() < best->time_s())) {
      second = best;
      best = &c;
    } else if (second == nullptr || c.time_s() < second->time_s()) {
      second = &c;
    }
  }
  if (best == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("no executable algorithm for ", OpName(shape.op), " on this layout"));
  }
  Choice choice;
  choice.model_name = best->name;
  choice.algorithm = best->generator.empty() ? best->name : best->generator;
  choice.chunk_bytes = best->chunk_bytes;
  choice.predicted_s = best->time_s() + options.op_overhead_s;
  choice.op_overhead_s = options.op_overhead_s;
  choice.ir_based = best->has_ir;
  if (one_node) {
    choice.reason = absl::StrCat("one node: local, single-pass kernels (closed form ",
                                 topology::FormatDuration(best->time_s()),
                                 "); a schedule would add a pass through memory per step");
  } else {
    choice.reason =
        absl::StrCat(best->name, " predicts ", topology::FormatDuration(best->time_s()),
                     best->has_ir ? " (schedule IR on the fabric simulator" : " (closed form",
                     best->has_ir && best->chunk_bytes > 0
                         ? absl::StrCat(", chunks of ", best->chunk_bytes, " B)")
                         : std::string(")"));
  }
  if (!one_node && second != nullptr) {
    absl::StrAppend(&choice.reason,
                    absl::StrFormat(", %.2fx faster than the next best, %s (%s)",
                                    second->time_s() / std::max(best->time_s(), 1e-15),
                                    second->name, topology::FormatDuration(second->time_s())));
  }
  choice.candidates = std::move(candidates);
  return choice;
}

Tuner::Tuner(CommLayout layout, topology::FabricSpec fabric, TunerOptions options)
    : layout_(std::move(layout)), fabric_(std::move(fabric)), options_(std::move(options)) {}

absl::StatusOr<std::shared_ptr<const Choice>> Tuner::Choose(const OpShape& shape) {
  const std::string key = ShapeKey(shape);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  absl::StatusOr<Choice> choice = Tune(shape, layout_, fabric_, options_);
  if (!choice.ok()) return choice.status();
  auto shared = std::make_shared<const Choice>(*std::move(choice));
  absl::MutexLock lock(&mu_);
  if (cache_.size() >= 256) cache_.clear();  // bounded; training repeats a few shapes
  cache_.emplace(key, shared);
  return shared;
}

}  // namespace railyard::scheduler::cost
