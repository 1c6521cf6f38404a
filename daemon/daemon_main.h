// railyardd's main(), with the test build's hooks as a parameter: daemon/main.cc passes none
// (the installed daemon), tests/support/railyardd_testing_main.cc passes the fakes.
#pragma once

#include "daemon/test_hooks.h"

namespace railyard {

// Parses the flags (and RAILYARD_<FLAG> variables), starts the server, serves until SIGTERM or
// SIGINT (SIGHUP reloads) and returns the process's exit code: 0 after a clean stop, 1 when the
// server cannot start, 2 for bad flags, including a test-only flag the hooks cannot serve.
int RunDaemon(int argc, char** argv, const TestHooks& hooks);

}  // namespace railyard
