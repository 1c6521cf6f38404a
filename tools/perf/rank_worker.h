// One rank of a railyard-perf run: a process the launcher spawned, with its own Client.
#pragma once

#include <cstddef>
#include <cstdio>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/util/unique_fd.h"
#include "tools/perf/perf_args.h"

namespace railyard::perf {

// What only the test build (railyard-perf-testing, tests/support/) gives a rank: --fake_device's
// allocations, a descriptor of `bytes` of the daemon's fake device `device` (railyardd-testing
// --fake_gpus). The installed railyard-perf has none and refuses --fake_device.
struct PerfHooks {
  std::function<absl::StatusOr<UniqueFd>(int device, size_t bytes)> fake_device_memory;
};

// Connects to args.socket, joins args.comm_id as args.rank, runs every (dtype, redop, size) case
// and, on rank 0, prints the table to `out`. Errors say what failed and why; rank 0 returns
// DATA_LOSS after the whole table when a data check found wrong elements.
absl::Status RunRank(const PerfArgs& args, const PerfHooks& hooks, FILE* out);

// railyard-perf's main(): the launcher, or a rank it spawned (the same binary, so a test build's
// ranks have its hooks too). The exit code: 0, 1 for a failed run, 2 for bad flags (including
// --fake_device without hooks.fake_device_memory).
int PerfMain(int argc, char** argv, const PerfHooks& hooks);

}  // namespace railyard::perf
