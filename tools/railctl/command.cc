#include "tools/railctl/command.h"

#include <google/protobuf/util/json_util.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace railyard::railctl {

absl::Status PrintJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  std::string json;
  auto converted = google::protobuf::util::MessageToJsonString(m, &json, options);
  if (!converted.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot print the reply as JSON: ", converted.ToString()));
  }
  std::printf("%s\n", json.c_str());
  return absl::OkStatus();
}
namespace {

// The payload that marks a status as a usage error.
constexpr absl::string_view kUsagePayload = "type.railyard.dev/railctl.UsageError";

}  // namespace

absl::Status UsageError(absl::string_view message) {
  return AsUsageError(absl::InvalidArgumentError(message));
}

absl::Status AsUsageError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kUsagePayload, absl::Cord("1"));
  return status;
}

int ExitCode(const absl::Status& status) {
  if (status.ok()) return 0;
  return status.GetPayload(kUsagePayload).has_value() ? 2 : 1;
}

std::string DefaultSocket() {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): nothing sets the environment.
  const char* env_socket = std::getenv("RAILYARD_SOCKET");
  return env_socket != nullptr && *env_socket != '\0' ? env_socket : "/run/railyard/railyard.sock";
}

absl::StatusOr<CommonFlags> ParseCommonFlags(const std::vector<std::string>& args) {
  CommonFlags flags;
  flags.socket = DefaultSocket();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--json") {
      flags.json = true;
    } else if (arg == "-h" || arg == "--help") {
      flags.help = true;
    } else if (arg == "--socket") {
      if (i + 1 >= args.size()) return absl::InvalidArgumentError("--socket needs a value");
      flags.socket = args[++i];
    } else if (arg.rfind("--socket=", 0) == 0) {
      flags.socket = arg.substr(9);
    } else if (arg == "--admin_socket") {
      if (i + 1 >= args.size()) return absl::InvalidArgumentError("--admin_socket needs a value");
      flags.admin_socket = args[++i];
    } else if (arg.rfind("--admin_socket=", 0) == 0) {
      flags.admin_socket = arg.substr(15);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument '", arg, "'"));
    }
  }
  if (flags.socket.empty()) return absl::InvalidArgumentError("--socket is empty");
  return flags;
}

}  // namespace railyard::railctl
