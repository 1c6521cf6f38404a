// railyard-perf's main() (PerfMain, rank_worker.h), shared by railyard-perf (main.cc) and the test
// build's railyard-perf-testing.
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

namespace railyard::perf {
namespace {

int RunWorker(const PerfArgs& args, const PerfHooks& hooks) {
  // A rank never outlives its launcher (checked after arming, in case it already died).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (args.parent_pid != 0 && getppid() != args.parent_pid) return 1;
  absl::Status st = RunRank(args, hooks, stdout);
  if (st.ok()) return 0;
  std::fprintf(stderr, "railyard-perf: rank %d: %s\n", args.rank, st.ToString().c_str());
  return 1;
}

}  // namespace

int PerfMain(int argc, char** argv, const PerfHooks& hooks) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as they are measured
  std::vector<std::string> flags(argv + 1, argv + argc);
  absl::StatusOr<PerfArgs> args =
      // NOLINTNEXTLINE(concurrency-mt-unsafe): single-threaded here; nothing sets the environment.
      ParsePerfArgs(flags, std::getenv("RAILYARD_SOCKET"));
  if (!args.ok()) {
    std::fprintf(stderr, "railyard-perf: %s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  if (args->help) {
    std::fputs(PerfUsage().c_str(), stdout);
    return 0;
  }
  // NOLINTNEXTLINE(concurrency-mt-unsafe): as above.
  if (const char* min_bw = std::getenv("NCCL_TESTS_MIN_BW"); min_bw != nullptr && *min_bw) {
    char* end = nullptr;
    const double v = std::strtod(min_bw, &end);
    if (end == min_bw || *end != '\0' || !(v >= 0)) {
      std::fprintf(stderr, "railyard-perf: NCCL_TESTS_MIN_BW='%s' is not a bandwidth in GB/s\n",
                   min_bw);
      return 2;
    }
    args->min_bw = v;
  }
  if (args->fake_device && hooks.fake_device_memory == nullptr) {
    std::fprintf(stderr,
                 "railyard-perf: --fake_device is a test-only flag and this railyard-perf has no "
                 "fake device memory: run railyard-perf-testing, which the test build makes "
                 "beside railyard-perf and nothing installs\n");
    return 2;
  }
  if (args->worker) return RunWorker(*args, hooks);
  return RunLauncher(*args, std::vector<std::string>(argv, argv + argc));
}

}  // namespace railyard::perf
