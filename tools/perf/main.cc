// railyard-perf: nccl-tests-compatible benchmark of railyard collectives (see PerfUsage()), as
// installed: no test hooks.
#include "tools/perf/rank_worker.h"

int main(int argc, char** argv) {
  return railyard::perf::PerfMain(argc, argv, railyard::perf::PerfHooks{});
}
