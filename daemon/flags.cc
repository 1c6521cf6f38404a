#include "daemon/flags.h"

#include <unistd.h>

#include <cctype>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "daemon/scheduler/algorithms/algorithms.h"
#include "daemon/util/log.h"

ABSL_FLAG(std::string, socket, "/run/railyard/railyard.sock",
          "Unix socket of the local (client) and admin gRPC APIs; created with mode 0660");
ABSL_FLAG(std::string, node_name, "",
          "This node's name in comm ids, logs and status (default: host name)");
ABSL_FLAG(std::string, peer_listen, "",
          "host:port of the daemon-to-daemon service; named as coordinator in comm ids when set");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port serving Prometheus /metrics, /healthz and /readyz (port 0: a free port; "
          "empty: off)");
ABSL_FLAG(std::string, topology, "",
          "JSON file describing this node's rails (docs/topology.md); default: one rail");
ABSL_FLAG(std::string, algo, "",
          "Default algorithm when a request forces none: local (one node), ring, tree, rhd, "
          "direct, hier, torus; empty: the tuner's choice");
ABSL_FLAG(absl::Duration, peer_timeout, absl::Seconds(10),
          "A peer daemon silent this long fails the communicators it shares with this one");
ABSL_FLAG(std::string, job_tokens, "",
          "File of 'job_id token' lines; when set, only these jobs may connect, with these tokens");
ABSL_FLAG(int, worker_threads, 0, "Threads executing collectives (0: one per CPU)");
ABSL_FLAG(absl::Duration, op_timeout, absl::Seconds(300),
          "Default wait for the other ranks' matching submission of an operation");
ABSL_FLAG(absl::Duration, init_timeout, absl::Seconds(120),
          "Default wait for all ranks to join a communicator");
ABSL_FLAG(int64_t, chunk_bytes, 256 * 1024, "Bytes per step of a local plan");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(2),
          "How long shutdown waits for RPCs in flight before cancelling them");
ABSL_FLAG(std::string, log_level, "info", "Minimum log level: debug, info, warn, error");
ABSL_FLAG(std::string, state_dir, "/var/lib/railyard",
          "Directory for persistent state: calibration.json (railctl calibrate); read at start");

namespace railyard {

const std::vector<std::string>& DaemonFlagNames() {
  static const auto* names = new std::vector<std::string>{
      "socket",     "node_name",    "peer_listen",  "job_tokens",     "worker_threads",
      "op_timeout", "init_timeout", "chunk_bytes",  "shutdown_grace", "log_level",
      "topology",   "algo",         "peer_timeout", "metrics_listen", "state_dir"};
  return *names;
}

absl::Status ApplyEnvironment(const char* (*getenv_fn)(const char*)) {
  for (const std::string& name : DaemonFlagNames()) {
    std::string var = "RAILYARD_";
    for (char c : name)
      var.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
    const char* value = getenv_fn(var.c_str());
    if (value == nullptr) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("environment ", var, "=", value, ": ", error));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DaemonConfig> ConfigFromFlags() {
  DaemonConfig c;
  c.socket = absl::GetFlag(FLAGS_socket);
  c.node_name = absl::GetFlag(FLAGS_node_name);
  if (c.node_name.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') {
      c.node_name = host;
    } else {
      c.node_name = "localhost";
    }
  }
  c.peer_listen = absl::GetFlag(FLAGS_peer_listen);
  c.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  c.job_tokens_file = absl::GetFlag(FLAGS_job_tokens);
  c.topology_file = absl::GetFlag(FLAGS_topology);
  c.algo = absl::GetFlag(FLAGS_algo);
  if (!c.algo.empty() && !scheduler::algorithms::IsAlgorithmName(c.algo)) {
    return absl::InvalidArgumentError(absl::StrCat("--algo '", c.algo, "' is not one of ",
                                                   scheduler::algorithms::AlgorithmNames()));
  }
  c.peer_timeout = absl::GetFlag(FLAGS_peer_timeout);
  if (c.peer_timeout <= absl::ZeroDuration() || c.peer_timeout > absl::Minutes(10)) {
    return absl::InvalidArgumentError("--peer_timeout must be in (0, 10m]");
  }
  c.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  if (c.worker_threads < 0 || c.worker_threads > 1024) {
    return absl::InvalidArgumentError("--worker_threads must be in [0, 1024]");
  }
  c.op_timeout = absl::GetFlag(FLAGS_op_timeout);
  c.init_timeout = absl::GetFlag(FLAGS_init_timeout);
  if (c.op_timeout <= absl::ZeroDuration() || c.init_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--op_timeout and --init_timeout must be positive");
  }
  const int64_t chunk = absl::GetFlag(FLAGS_chunk_bytes);
  if (chunk < 4096 || chunk > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("--chunk_bytes must be in [4096, 2^30]");
  }
  c.chunk_bytes = static_cast<size_t>(chunk);
  c.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  c.state_dir = absl::GetFlag(FLAGS_state_dir);
  LogLevel level;
  if (!ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    return absl::InvalidArgumentError("--log_level must be debug, info, warn or error");
  }
  SetLogLevel(level);
  return c;
}

}  // namespace railyard
