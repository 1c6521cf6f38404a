// railyardd: the per-node collective communication daemon. main() only turns flags into config.
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "daemon/flags.h"
#include "daemon/server.h"
#include "daemon/topology/topology_graph.h"
#include "daemon/transport/ucx/ucx_transport.h"
#include "daemon/util/cpu_affinity.h"
#include "daemon/util/log.h"

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "railyardd [--socket PATH] [flags]; every flag is also RAILYARD_<FLAG>");
  // Signals are taken synchronously by sigwait below, never by a handler on a random thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // Debian builds Abseil without NDEBUG, which leaves its mutex deadlock detection on: every
  // Lock() then updates a global lock-order graph (GraphCycles, under its own global lock), a
  // cost on every mutex of the data path. The sanitizer build keeps it (tests run there).
#if !defined(__SANITIZE_ADDRESS__)
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif

  if (absl::Status s = railyard::ApplyEnvironment(
          [](const char* name) -> const char* { return std::getenv(name); });
      !s.ok()) {
    std::fprintf(stderr, "railyardd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // Before any thread starts (setenv), and before UCX reads its configuration.
  const std::vector<std::string> ucx_defaults = railyard::transport::SetUcxTcpDefaults();
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<railyard::DaemonConfig> config = railyard::ConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "railyardd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (!config->cpus.empty()) {
    // Before the server starts a thread: each one inherits the set.
    if (absl::Status s = railyard::PinProcessToCpus(config->cpus); !s.ok()) {
      std::fprintf(stderr, "railyardd: --cpus=%s: %s\n",
                   railyard::topology::FormatCpuList(config->cpus).c_str(),
                   std::string(s.message()).c_str());
      return 2;
    }
    railyard::Log(railyard::LogLevel::kInfo, "daemon", "pinned to CPUs",
                  {railyard::F("cpus", railyard::topology::FormatCpuList(config->cpus))});
  }
  if (config->test_flip_bit_every > 0) {
    railyard::Log(
        railyard::LogLevel::kWarning, "daemon",
        "TEST ONLY fault injection on: one bit of every Nth inter-node message is flipped",
        {railyard::F("test_flip_bit_every", config->test_flip_bit_every)});
  }
  if (!ucx_defaults.empty()) {
    railyard::Log(railyard::LogLevel::kInfo, "daemon",
                  "UCX tcp settings (the environment may override)",
                  {railyard::F("set", absl::StrJoin(ucx_defaults, " "))});
  }
  railyard::Server server(*config);
  if (absl::Status s = server.Start(); !s.ok()) {
    railyard::Log(railyard::LogLevel::kError, "daemon", "cannot start",
                  {railyard::F("reason", s.message())});
    return 1;
  }
  int sig = 0;
  // SIGHUP reloads what can be reloaded (--job_weights); SIGTERM and SIGINT stop.
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) server.Reload();
  railyard::Log(railyard::LogLevel::kInfo, "daemon", "signal received",
                {railyard::F("signal", sig)});
  server.Shutdown();
  return 0;
}
