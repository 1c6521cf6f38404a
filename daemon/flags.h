// railyardd's command-line flags. Each --flag may also be set by the environment variable
// RAILYARD_<FLAG> (upper case); the command line wins over the environment.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/config.h"

namespace railyard {

// Names of the flags that the environment may set.
const std::vector<std::string>& DaemonFlagNames();

// Sets flags from RAILYARD_<FLAG> variables of env (a getenv-like lookup). Call before parsing the
// command line so that it overrides. INVALID_ARGUMENT names the variable with a bad value.
absl::Status ApplyEnvironment(const char* (*getenv_fn)(const char*));

// The node's memory (MemTotal of /proc/meminfo), 0 when unknown: what node-sized defaults divide.
uint64_t NodeMemoryBytes();

// Builds the config from the parsed flags. INVALID_ARGUMENT for inconsistent values.
absl::StatusOr<DaemonConfig> ConfigFromFlags();

}  // namespace railyard
