#include "daemon/scheduler/sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/kernels/types.h"
#include "daemon/scheduler/algorithms/algorithms.h"
#include "daemon/scheduler/sim/engine.h"

namespace railyard::scheduler::sim {
namespace {

using topology::FabricKind;
using topology::FabricSpec;

// The message bytes M of PRIMER for a shape (op.h).
double MessageBytes(const OpShape& shape, int nranks) {
  return scheduler::MessageBytes(shape.op, shape.dtype, shape.count, nranks, &shape.a2av_counts);
}

// Innetwork's chunk: the job's, else M / kInNetworkChunks but at least 64 KiB.
uint64_t InNetworkChunk(uint64_t m, size_t chunk_bytes) {
  if (chunk_bytes > 0) return chunk_bytes;
  return std::max<uint64_t>(64 * 1024, (m + kInNetworkChunks - 1) / kInNetworkChunks);
}

absl::Status CheckInNetwork(const FabricSpec& f, const OpShape& shape) {
  if (!f.in_network_reduction) {
    return absl::InvalidArgumentError(
        "innetwork needs a fabric whose switches reduce (in_network_reduction)");
  }
  if (f.kind == FabricKind::kTorus) {
    return absl::InvalidArgumentError("innetwork is not modelled on a torus (no switches)");
  }
  if (shape.op != OpKind::kAllReduce) {
    return absl::InvalidArgumentError(
        absl::StrCat("innetwork implements allreduce only, not ", OpName(shape.op)));
  }
  return absl::OkStatus();
}

// The innetwork flows of one job (see simulator.h): per chunk, every rank's up flow (streamed
// behind its previous chunk), a join, every rank's down flow.
void AddInNetwork(const std::vector<int32_t>& frank, uint64_t m, size_t chunk_bytes, uint32_t job,
                  FlowGraph* graph) {
  const auto n = static_cast<uint32_t>(frank.size());
  const uint64_t chunk = InNetworkChunk(m, chunk_bytes);
  const uint64_t nchunks = m == 0 ? 1 : (m + chunk - 1) / chunk;
  std::vector<Flow> flows;
  std::vector<uint64_t> begin = {0};
  std::vector<uint32_t> deps;
  flows.reserve(nchunks * (2 * n + 1));
  const auto add = [&](int32_t src, int32_t dst, uint64_t bytes, uint8_t flags) {
    Flow f;
    f.bytes = bytes;
    f.src = src;
    f.dst = dst;
    f.job = job;
    f.flags = flags;
    flows.push_back(f);
    begin.push_back(deps.size());
  };
  // up[r] / down[r]: local index of rank r's previous chunk.
  std::vector<uint32_t> up(n), down(n);
  for (uint64_t c = 0; c < nchunks; ++c) {
    const uint64_t bytes = std::min(chunk, m - std::min(m, c * chunk));
    const uint8_t stream = c == 0 ? 0 : Flow::kNoAlpha;
    for (uint32_t r = 0; r < n; ++r) {
      if (c > 0) deps.push_back(up[r]);
      add(frank[r], kSwitch, bytes, stream);
      up[r] = static_cast<uint32_t>(flows.size() - 1);
    }
    deps.insert(deps.end(), up.begin(), up.end());
    add(kSwitch, kSwitch, 0, Flow::kJoin);
    const auto join = static_cast<uint32_t>(flows.size() - 1);
    for (uint32_t r = 0; r < n; ++r) {
      deps.push_back(join);
      if (c > 0) deps.push_back(down[r]);
      add(kSwitch, frank[r], bytes, stream);
      down[r] = static_cast<uint32_t>(flows.size() - 1);
    }
  }
  graph->AddFlows(flows, begin, deps);
}

std::vector<TierStats> PresentTiers(const FabricModel& model, const std::vector<TierStats>& all) {
  std::vector<TierStats> out;
  for (int t = 0; t < kNumTiers; ++t) {
    if (model.HasTier(t)) out.push_back(all[t]);
  }
  return out;
}

double Log2Ceil(int n) { return n <= 1 ? 0 : std::ceil(std::log2(static_cast<double>(n))); }

}  // namespace

absl::Status CheckFabric(const FabricSpec& f) {
  if (f.nodes < 1 || f.ranks_per_node < 1 || f.rails < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("fabric needs >= 1 node, rank per node and rail (", f.nodes, ", ",
                     f.ranks_per_node, ", ", f.rails, ")"));
  }
  if (f.rails > 255) {  // the engine keys a connection by job and rail (8 bits)
    return absl::InvalidArgumentError(
        absl::StrCat("fabric with ", f.rails, " rails per node: at most 255"));
  }
  if (static_cast<int64_t>(f.nodes) * f.ranks_per_node > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fabric of ", f.nodes, " x ", f.ranks_per_node, " ranks is too large"));
  }
  if (!(f.intra.beta_bytes_per_s > 0) || !(f.inter.beta_bytes_per_s > 0)) {
    return absl::InvalidArgumentError("fabric bandwidths (intra and inter beta) must be > 0");
  }
  if (!(f.intra.alpha_s >= 0) || !(f.inter.alpha_s >= 0) || !(f.overhead_s >= 0)) {
    return absl::InvalidArgumentError("fabric alphas and overhead must be >= 0");
  }
  if (f.kind == FabricKind::kThreeTier && (f.nodes_per_rack < 1 || !(f.oversubscription >= 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat("three_tier needs nodes_per_rack >= 1 and oversubscription >= 1 (got ",
                     f.nodes_per_rack, ", ", f.oversubscription, ")"));
  }
  if (f.kind == FabricKind::kTorus) {
    int64_t product = 1;
    for (int d : f.torus_dims) {
      if (d < 1) return absl::InvalidArgumentError("torus dimensions must be >= 1");
      product *= d;
    }
    if (f.torus_dims.empty() || product != f.nodes) {
      return absl::InvalidArgumentError(absl::StrCat("torus ", absl::StrJoin(f.torus_dims, "x"),
                                                     " does not have ", f.nodes, " nodes"));
    }
  }
  return absl::OkStatus();
}

CommLayout JobLayout(const FabricSpec& fabric, const JobSpec& job) {
  const int k = job.nodes.empty() ? fabric.nodes : static_cast<int>(job.nodes.size());
  const int g = job.ranks_per_node == 0 ? fabric.ranks_per_node : job.ranks_per_node;
  CommLayout l = CommLayout::Uniform(k, g, fabric.rails);
  bool identity = k == fabric.nodes;
  for (int i = 0; identity && i < static_cast<int>(job.nodes.size()); ++i) {
    identity = job.nodes[i] == i;
  }
  if (fabric.kind == FabricKind::kTorus && identity && g == 1) l.torus_dims = fabric.torus_dims;
  return l;
}

uint64_t EstimateTransfers(const std::string& algo, const OpShape& shape, const CommLayout& layout,
                           size_t chunk_bytes) {
  const double n = layout.nranks, k = layout.nnodes;
  const double g = std::max(1, layout.ranks_per_node());
  const double m = MessageBytes(shape, layout.nranks);
  const OpKind op = shape.op;
  const bool ar = op == OpKind::kAllReduce;
  const bool rs_ag = op == OpKind::kReduceScatter || op == OpKind::kAllGather;
  const bool a2a = op == OpKind::kAllToAll || op == OpKind::kAllToAllv;
  const bool rooted = op == OpKind::kBroadcast || op == OpKind::kReduce;
  // Steps of the unchunked program (an upper estimate) and bytes it moves, memory copies included.
  double steps = n, bytes = 3 * n * m;
  if (algo == kAlgoInNetwork) {
    const double chunk = static_cast<double>(InNetworkChunk(static_cast<uint64_t>(m), chunk_bytes));
    return static_cast<uint64_t>((2 * n + 1) * std::max(1.0, std::ceil(m / chunk)));
  }
  if (op == OpKind::kBarrier) {
    steps = k * k;
    bytes = 0;
  } else if (algo == kAlgoRing) {
    steps = ar ? 3 * n * (n - 1) + n : rs_ag ? 2 * n * n : 2 * n;
  } else if (algo == kAlgoTree) {
    steps = ar ? 8 * n : 4 * n;
    bytes = 4 * n * m;
  } else if (algo == kAlgoRhd) {
    steps = 4 * n * (Log2Ceil(layout.nranks) + 2);
  } else if (algo == kAlgoDirect) {
    steps = 2 * n * n + n;
  } else if (algo == kAlgoHier) {
    steps = ar ? 2 * k * g * g + g * 3 * k * k : rooted ? k * g * g + 2 * g * k : 2 * n * n;
    if (a2a) steps = 2 * k * k * g * g + k * g * g;
  } else if (algo == kAlgoTorus) {
    double dims = 0;
    for (int d : layout.torus_dims) dims += d;
    steps = ar ? 3 * n * dims : 2 * n * n;
  }
  const double chunked = chunk_bytes == 0 ? 0 : bytes / static_cast<double>(chunk_bytes);
  return static_cast<uint64_t>(std::min(1e19, steps + chunked));
}

absl::StatusOr<SimResult> Simulate(const FabricSpec& fabric, const std::vector<JobSpec>& jobs,
                                   const SimOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (auto s = CheckFabric(fabric); !s.ok()) return s;
  if (jobs.empty()) return absl::InvalidArgumentError("no jobs to simulate");
  const FabricModel model(fabric);
  FlowGraph graph;
  SimResult out;
  std::vector<std::string> algos;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const JobSpec& job = jobs[j];
    const std::string name = job.name.empty() ? absl::StrCat("job", j) : job.name;
    const auto fail = [&](const absl::Status& s) {
      return absl::Status(s.code(), absl::StrCat("job '", name, "': ", s.message()));
    };
    const int g = job.ranks_per_node == 0 ? fabric.ranks_per_node : job.ranks_per_node;
    if (g < 1 || g > fabric.ranks_per_node) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "ranks_per_node ", g, " not in [1, ", fabric.ranks_per_node, "] (the fabric's)")));
    }
    std::vector<int> nodes = job.nodes;
    if (nodes.empty()) {
      for (int i = 0; i < fabric.nodes; ++i) nodes.push_back(i);
    }
    std::vector<bool> used(fabric.nodes, false);
    for (int node : nodes) {
      if (node < 0 || node >= fabric.nodes) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("node ", node, " not in the fabric's [0, ", fabric.nodes, ")")));
      }
      if (used[node]) {
        return fail(absl::InvalidArgumentError(absl::StrCat("node ", node, " listed twice")));
      }
      used[node] = true;
    }
    const CommLayout layout = JobLayout(fabric, job);
    std::vector<int32_t> frank(layout.nranks);
    for (int r = 0; r < layout.nranks; ++r) {
      frank[r] = nodes[r / g] * fabric.ranks_per_node + r % g;
    }
    if (job.algorithm.empty()) {
      return fail(absl::InvalidArgumentError(
          "names no algorithm (the cost model's tuner picks one: railctl simulate does)"));
    }
    const std::string& algo = job.algorithm;
    const uint64_t estimate = EstimateTransfers(algo, job.shape, layout, job.chunk_bytes);
    if (estimate > kMaxSimulatedTransfers) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          algo, " ", OpName(job.shape.op), " on ", layout.nranks, " ranks",
          job.chunk_bytes > 0 ? absl::StrCat(" in chunks of ", job.chunk_bytes, " B") : "", " is ~",
          estimate / 1000000, "M transfers, above the simulator's budget of ",
          kMaxSimulatedTransfers / 1000000,
          "M: use an algorithm with fewer steps (hier, tree, rhd; torus on a torus), a larger "
          "chunk size, or a smaller cluster")));
    }
    if (algo == kAlgoInNetwork) {
      if (auto s = CheckInNetwork(fabric, job.shape); !s.ok()) return fail(s);
      AddInNetwork(frank, static_cast<uint64_t>(MessageBytes(job.shape, layout.nranks)),
                   job.chunk_bytes, static_cast<uint32_t>(j), &graph);
    } else {
      absl::StatusOr<RankSchedule> schedule = Generate(algo, job.shape, layout, job.chunk_bytes);
      if (!schedule.ok()) return fail(schedule.status());
      if (auto s = graph.AddSchedule(*schedule, frank, static_cast<uint32_t>(j)); !s.ok()) {
        return fail(s);
      }
    }
    JobResult r;
    r.name = name;
    r.algorithm = algo;
    out.jobs.push_back(std::move(r));
  }
  EngineResult er;
  if (auto s = RunEngine(model, graph, static_cast<int>(jobs.size()), &er); !s.ok()) return s;
  std::vector<TierStats> total(kNumTiers);
  for (int t = 0; t < kNumTiers; ++t) total[t].tier = TierName(t);
  for (size_t j = 0; j < jobs.size(); ++j) {
    JobResult& r = out.jobs[j];
    r.time_s = er.job_time[j];
    r.transfers = er.job_flows[j];
    r.tiers = PresentTiers(model, er.job_tiers[j]);
    for (int t = 0; t < kNumTiers; ++t) {
      total[t].bytes += er.job_tiers[j][t].bytes;
      total[t].messages += er.job_tiers[j][t].messages;
    }
    out.time_s = std::max(out.time_s, r.time_s);
    out.transfers += r.transfers;
  }
  out.tiers = PresentTiers(model, total);
  int64_t best = -1;
  for (size_t l = 0; l < er.link_bytes.size(); ++l) {
    if (er.link_bytes[l] == 0) continue;
    const auto load = [&](size_t i) {
      return static_cast<double>(er.link_bytes[i]) / model.capacity(static_cast<uint32_t>(i));
    };
    if (best < 0 || load(l) > load(best) ||
        (load(l) == load(best) && er.link_busy[l] > er.link_busy[best])) {
      best = static_cast<int64_t>(l);
    }
    if (options.all_links) {
      const auto id = static_cast<uint32_t>(l);
      out.links.push_back(
          {model.Name(id), TierName(model.tier(id)), er.link_bytes[l], er.link_busy[l]});
    }
  }
  if (best >= 0) {
    const auto id = static_cast<uint32_t>(best);
    out.busiest_link = {model.Name(id), TierName(model.tier(id)), er.link_bytes[best],
                        er.link_busy[best]};
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

absl::StatusOr<JobResult> SimulateSchedule(const RankSchedule& schedule, const CommLayout& layout,
                                           const FabricSpec& fabric) {
  if (auto s = CheckFabric(fabric); !s.ok()) return s;
  if (layout.nnodes > fabric.nodes ||
      layout.ranks_of_node.size() != static_cast<size_t>(layout.nnodes) ||
      layout.node_of_rank.size() != static_cast<size_t>(layout.nranks) ||
      layout.local_index_of_rank.size() != static_cast<size_t>(layout.nranks)) {
    return absl::InvalidArgumentError(absl::StrCat("layout of ", layout.nnodes,
                                                   " nodes does not fit the fabric's ",
                                                   fabric.nodes, " (or is inconsistent)"));
  }
  std::vector<int32_t> frank(layout.nranks);
  for (int r = 0; r < layout.nranks; ++r) {
    const int node = layout.node_of_rank[r], local = layout.local_index_of_rank[r];
    if (node < 0 || node >= layout.nnodes || local < 0 || local >= fabric.ranks_per_node) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " (node ", node, ", local index ",
                                                     local, ") does not fit the fabric's ",
                                                     fabric.ranks_per_node, " ranks per node"));
    }
    frank[r] = node * fabric.ranks_per_node + local;
  }
  const FabricModel model(fabric);
  FlowGraph graph;
  if (auto s = graph.AddSchedule(schedule, frank, 0); !s.ok()) return s;
  EngineResult er;
  if (auto s = RunEngine(model, graph, 1, &er); !s.ok()) return s;
  JobResult r;
  r.name = schedule.algorithm;
  r.algorithm = schedule.algorithm;
  r.time_s = er.job_time[0];
  r.transfers = er.job_flows[0];
  r.tiers = PresentTiers(model, er.job_tiers[0]);
  return r;
}

}  // namespace railyard::scheduler::sim
