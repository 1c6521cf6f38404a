// railyard-perf: nccl-tests-compatible benchmark of railyard collectives (see PerfUsage()).
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tools/perf/perf_args.h"
#include "tools/perf/rank_launcher.h"
#include "tools/perf/rank_worker.h"

namespace {

int RunWorker(const railyard::perf::PerfArgs& args) {
  // A rank never outlives its launcher (checked after arming, in case it already died).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (args.parent_pid != 0 && getppid() != args.parent_pid) return 1;
  absl::Status st = railyard::perf::RunRank(args, stdout);
  if (st.ok()) return 0;
  std::fprintf(stderr, "railyard-perf: rank %d: %s\n", args.rank, st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as they are measured
  std::vector<std::string> flags(argv + 1, argv + argc);
  absl::StatusOr<railyard::perf::PerfArgs> args =
      // NOLINTNEXTLINE(concurrency-mt-unsafe): single-threaded here; nothing sets the environment.
      railyard::perf::ParsePerfArgs(flags, std::getenv("RAILYARD_SOCKET"));
  if (!args.ok()) {
    std::fprintf(stderr, "railyard-perf: %s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  if (args->help) {
    std::fputs(railyard::perf::PerfUsage().c_str(), stdout);
    return 0;
  }
  if (args->worker) return RunWorker(*args);
  return railyard::perf::RunLauncher(*args, std::vector<std::string>(argv, argv + argc));
}
