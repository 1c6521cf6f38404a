// The parent process of a railyard-perf run: makes the communicator id, spawns the rank
// processes, and waits for them with a deadline, never longer.
#pragma once

#include <string>
#include <vector>

#include "tools/perf/perf_args.h"

namespace railyard::perf {

// Runs the benchmark with args.nranks() rank processes (re-executions of /proc/self/exe with the
// hidden worker flags) and returns the exit code: 0 when every rank succeeded. On failure prints
// one line on stderr naming the rank that failed first and why, and kills (by pid) the ranks still
// running a few seconds later. argv: this process's arguments, program name first.
int RunLauncher(const PerfArgs& args, const std::vector<std::string>& argv);

}  // namespace railyard::perf
