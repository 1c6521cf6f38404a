// One rank of a railyard-perf run: a process the launcher spawned, with its own Client.
#pragma once

#include <cstdio>

#include "absl/status/status.h"
#include "tools/perf/perf_args.h"

namespace railyard::perf {

// Connects to args.socket, joins args.comm_id as args.rank, runs every (dtype, redop, size) case
// and, on rank 0, prints the table to `out`. Errors say what failed and why; rank 0 returns
// DATA_LOSS after the whole table when a data check found wrong elements.
absl::Status RunRank(const PerfArgs& args, FILE* out);

}  // namespace railyard::perf
