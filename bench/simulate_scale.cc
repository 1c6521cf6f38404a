// simulate_scale: wall time and peak memory of the fabric simulator at cluster scale (issue #4:
// "railctl simulate must handle 1024 nodes x 8 ranks in seconds").
//
// cpu is the CPU time of Simulate() (user + system): on a shared machine wall time also measures
// the neighbours.
//
//   simulate_scale [--nodes K] [--ranks-per-node G] [--size BYTES] [--chunk BYTES] [--op OP]
//                  [--algo A[,A...]] [--torus XxY] [--split]
//
// Each algorithm runs in a fresh child process (fork) so that its peak RSS (getrusage
// ru_maxrss of the child) is its own, not the high-water mark of an earlier run. --split also
// times the phases on their own: Generate(), building the flow graph (FlowGraph::AddSchedule) and
// the event-driven run (RunEngine); then the schedule is dropped and Simulate() runs as usual.
// Defaults: 1024 x 8, 256 MB AllReduce, hier,rhd,tree, plus torus on a 64x128 torus.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "daemon/scheduler/op.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/scheduler/sim/engine.h"
#include "daemon/scheduler/sim/simulator.h"
#include "daemon/topology/fabric.h"

namespace {

using railyard::scheduler::CommLayout;
using railyard::scheduler::OpKind;
using railyard::scheduler::OpShape;
namespace sim = railyard::scheduler::sim;
namespace topology = railyard::topology;

struct Args {
  int nodes = 1024;
  int g = 8;
  uint64_t size = 256'000'000;
  uint64_t chunk = 0;
  std::string op = "allreduce";
  std::vector<std::string> algos = {"hier", "rhd", "tree", "torus"};
  std::vector<int> torus = {64, 128};
  bool split = false;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "simulate_scale: %s\nusage: simulate_scale [--nodes K] [--ranks-per-node G] "
               "[--size BYTES] [--chunk BYTES] [--op OP] [--algo A[,A...]] [--torus XxY] "
               "[--split]\n",
               why);
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--split") {
      a.split = true;
      continue;
    }
    if (i + 1 >= argc) Usage(("missing value for " + flag).c_str());
    const std::string v = argv[++i];
    bool ok = true;
    if (flag == "--nodes") {
      ok = absl::SimpleAtoi(v, &a.nodes) && a.nodes > 0;
    } else if (flag == "--ranks-per-node") {
      ok = absl::SimpleAtoi(v, &a.g) && a.g > 0;
    } else if (flag == "--size") {
      ok = absl::SimpleAtoi(v, &a.size);
    } else if (flag == "--chunk") {
      ok = absl::SimpleAtoi(v, &a.chunk);
    } else if (flag == "--op") {
      a.op = v;
    } else if (flag == "--algo") {
      a.algos = absl::StrSplit(v, ',');
    } else if (flag == "--torus") {
      a.torus.clear();
      for (absl::string_view d : absl::StrSplit(v, 'x')) {
        int x = 0;
        ok = ok && absl::SimpleAtoi(d, &x) && x > 0;
        a.torus.push_back(x);
      }
    } else {
      Usage(("unknown flag " + flag).c_str());
    }
    if (!ok) Usage(("bad value for " + flag + ": " + v).c_str());
  }
  return a;
}

double CpuSeconds() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs one algorithm in this process; prints one line; returns the exit code.
int RunOne(const Args& a, const std::string& algo) {
  topology::FabricSpec f;
  f.kind = topology::FabricKind::kTwoTier;
  f.nodes = a.nodes;
  f.ranks_per_node = a.g;
  f.rails = a.g;
  f.intra.alpha_s = 1e-6;
  f.intra.beta_bytes_per_s = 100e9;
  f.inter.alpha_s = 5e-6;
  f.inter.beta_bytes_per_s = 25e9;
  if (algo == "torus") {
    f.kind = topology::FabricKind::kTorus;
    f.torus_dims = a.torus;
    f.nodes = 1;
    for (int d : a.torus) f.nodes *= d;
    f.ranks_per_node = 1;
    f.rails = 1;
  }
  sim::JobSpec job;
  job.algorithm = algo;
  job.chunk_bytes = a.chunk;
  if (!railyard::scheduler::ParseOpName(a.op, &job.shape.op)) {
    Usage(("unknown op " + a.op).c_str());
  }
  job.shape.count = a.size / 4;  // float32
  const CommLayout layout = sim::JobLayout(f, job);
  const uint64_t estimate = sim::EstimateTransfers(algo, job.shape, layout, a.chunk);
  double gen_s = -1, gen_cpu = -1;  // --split: Generate() alone
  double graph_cpu = -1, engine_cpu = -1;
  uint64_t generated = 0, deps = 0;
  if (a.split && algo != sim::kAlgoInNetwork) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = CpuSeconds();
    absl::StatusOr<railyard::scheduler::RankSchedule> s =
        railyard::scheduler::Generate(algo, job.shape, layout, a.chunk);
    gen_s = Seconds(t0);
    gen_cpu = CpuSeconds() - c0;
    if (s.ok()) {
      generated = s->transfers.size();
      for (const auto& t : s->transfers) deps += t.deps.size();
      std::vector<int32_t> frank(layout.nranks);
      for (int r = 0; r < layout.nranks; ++r) frank[r] = r;  // the job spans the fabric in order
      const sim::FabricModel model(f);
      sim::FlowGraph graph;
      double c1 = CpuSeconds();
      absl::Status st = graph.AddSchedule(*s, frank, 0);
      graph_cpu = CpuSeconds() - c1;
      s = absl::StatusOr<railyard::scheduler::RankSchedule>();  // the engine runs without it
      sim::EngineResult er;
      c1 = CpuSeconds();
      if (st.ok()) st = sim::RunEngine(model, graph, 1, &er);
      engine_cpu = CpuSeconds() - c1;
      if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = CpuSeconds();
  absl::StatusOr<sim::SimResult> r = sim::Simulate(f, {job});
  const double wall = Seconds(t0);
  const double cpu = CpuSeconds() - c0;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const std::string shape =
      algo == "torus"
          ? std::to_string(a.torus[0]) + "x" + std::to_string(a.torus.size() > 1 ? a.torus[1] : 1)
          : std::to_string(a.nodes) + "x" + std::to_string(a.g);
  if (!r.ok()) {
    std::printf("%-6s %-10s %s: %s\n", algo.c_str(), shape.c_str(), a.op.c_str(),
                std::string(r.status().message()).c_str());
    return 1;
  }
  std::printf(
      "%-6s %-9s %s %llu B chunk %llu: wall %.2f s  cpu %.2f s  peak RSS %.0f MB  transfers %llu "
      "(estimate %llu)  predicted %.4f s",
      algo.c_str(), shape.c_str(), a.op.c_str(), static_cast<unsigned long long>(a.size),
      static_cast<unsigned long long>(a.chunk), wall, cpu, ru.ru_maxrss / 1024.0,
      static_cast<unsigned long long>(r->transfers), static_cast<unsigned long long>(estimate),
      r->time_s);
  if (a.split) {
    std::printf(
        "  [generate %.2f s (cpu %.2f s), %llu transfers, %llu deps; cpu: graph %.2f s, "
        "engine %.2f s]",
        gen_s, gen_cpu, static_cast<unsigned long long>(generated),
        static_cast<unsigned long long>(deps), graph_cpu, engine_cpu);
  }
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  int rc = 0;
  for (const std::string& algo : a.algos) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      const int code = RunOne(a, algo);
      std::fflush(stdout);
      std::_Exit(code);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      rc = 1;
    }
  }
  return rc;
}
