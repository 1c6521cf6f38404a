// railctl: the operator's CLI for railyardd. `railctl <command> [flags]`.
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "tools/railctl/calibrate_command.h"
#include "tools/railctl/command.h"
#include "tools/railctl/diagnose_command.h"
#include "tools/railctl/explain_command.h"
#include "tools/railctl/jobs_command.h"
#include "tools/railctl/model_command.h"
#include "tools/railctl/simulate_command.h"
#include "tools/railctl/status_command.h"
#include "tools/railctl/token_command.h"
#include "tools/railctl/topo_command.h"

namespace {

using railyard::railctl::Command;

// One row per subcommand (topo, model, simulate, explain join here).
constexpr Command kCommands[] = {
    {"status", "what the daemon is doing: jobs, communicators, sessions",
     railyard::railctl::RunStatus},
    {"jobs", "jobs' fair-share weights and what each sent per paced rail; set-weight JOB W",
     railyard::railctl::RunJobs},
    {"diagnose", "which rank, node or link a communicator waits for, across its daemons",
     railyard::railctl::RunDiagnose},
    {"topo", "this node's topology graph: GPUs, NICs, rails, NUMA (daemon, discovery or file)",
     railyard::railctl::RunTopo},
    {"model", "cost-model predictions without a daemon: algorithms, crossover, critical size",
     railyard::railctl::RunModel},
    {"explain", "why a communicator would run an operation with the algorithm it picks",
     railyard::railctl::RunExplain},
    {"simulate", "run an operation's schedule through the fabric simulator (jobs, tiers, links)",
     railyard::railctl::RunSimulate},
    {"calibrate", "measure daemons with railyard-perf and fit the cost model's link classes",
     railyard::railctl::RunCalibrate},
    {"token", "signed job tokens: make a cluster key, issue a job's token, verify one",
     railyard::railctl::RunToken},
};

void PrintUsage(FILE* out) {
  std::fputs(
      "Usage: railctl <command> [flags]; railctl <command> --help for its flags\n\n"
      "Commands:\n",
      out);
  for (const Command& command : kCommands) {
    std::fprintf(out, "  %-10s %s\n", std::string(command.name).c_str(),
                 std::string(command.summary).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs("railctl: missing command (try 'railctl help')\n", stderr);
    return 1;
  }
  const std::string_view name = argv[1];
  if (name == "help" || name == "-h" || name == "--help") {
    PrintUsage(stdout);
    return 0;
  }
  for (const Command& command : kCommands) {
    if (command.name != name) continue;
    absl::Status status = command.run(std::vector<std::string>(argv + 2, argv + argc));
    if (status.ok()) return 0;
    // Without payloads (the usage mark is for the exit code, not the reader).
    std::fprintf(stderr, "railctl: %s: %s\n", argv[1],
                 status.ToString(absl::StatusToStringMode::kWithNoExtraData).c_str());
    return railyard::railctl::ExitCode(status);
  }
  std::fprintf(stderr, "railctl: unknown command '%s' (try 'railctl help')\n", argv[1]);
  return 1;
}
