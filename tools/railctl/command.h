// railctl subcommands: each is a name, a one-line summary and a function of its arguments.
// Adding one (topo, model, simulate, explain) is a new file plus a row in main.cc's table.
#pragma once

#include <google/protobuf/message.h>

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace railyard::railctl {

struct Command {
  std::string_view name;
  std::string_view summary;
  // Runs with the arguments after the subcommand name; output on stdout. An error is printed by
  // main() as one line on stderr (exit ExitCode(status): 1, or 2 for a UsageError).
  absl::Status (*run)(const std::vector<std::string>& args);
};

// Flags every daemon-facing subcommand takes.
struct CommonFlags {
  std::string socket;        // --socket; default $RAILYARD_SOCKET, else /run/railyard/railyard.sock
  std::string admin_socket;  // --admin_socket; empty: AdminClient's default for socket
  bool json = false;         // --json: protobuf JSON instead of the human table
  bool help = false;         // -h, --help
};

// INVALID_ARGUMENT marked as a usage error (bad, missing or unknown flags): main() exits 2.
absl::Status UsageError(absl::string_view message);
// status marked as a usage error (its code and message kept).
absl::Status AsUsageError(absl::Status status);
// main()'s exit code for a command's status: 0 when OK, 2 for a usage error, else 1.
int ExitCode(const absl::Status& status);

// Prints m as protobuf JSON (every field, defaults too) and a newline on stdout.
absl::Status PrintJson(const google::protobuf::Message& m);

// $RAILYARD_SOCKET, else /run/railyard/railyard.sock.
std::string DefaultSocket();

// Parses --socket S / --socket=S, --admin_socket S / --admin_socket=S, --json, -h/--help;
// anything else is INVALID_ARGUMENT.
absl::StatusOr<CommonFlags> ParseCommonFlags(const std::vector<std::string>& args);

}  // namespace railyard::railctl
