#include "daemon/daemon_main.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "daemon/flags.h"
#include "daemon/server.h"
#include "daemon/topology/cpu_affinity.h"
#include "daemon/topology/topology_graph.h"
#include "daemon/transport/ucx/ucx_transport.h"
#include "daemon/util/log.h"
#include "daemon/util/sd_notify.h"

namespace railyard {
namespace {

// A test-only flag needs the hook that serves it; the installed railyardd has none.
absl::Status CheckTestFlags(const DaemonConfig& config, const TestHooks& hooks) {
  constexpr char kWhere[] =
      "railyardd-testing, which the test build makes beside railyardd and nothing installs";
  if (config.fake_gpus > 0 && hooks.fake_devices == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fake_gpus is a test-only flag and this railyardd has no fake device "
                     "runtime: run ",
                     kWhere));
  }
  if (config.test_flip_bit_every > 0 && hooks.flip_bits == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--test_flip_bit_every is a test-only flag and this railyardd has no fault "
                     "injection: run ",
                     kWhere));
  }
  return absl::OkStatus();
}

// SIGUSR2: starts the binary at the path this daemon was started from (an upgrade has replaced
// the file by now) with this daemon's arguments and --takeover, detached (a grandchild: nothing
// here waits for it). It takes the node over and, under systemd (Type=notify, NotifyAccess=all),
// tells systemd it is the service's main process now; this daemon hands over and exits. A
// successor that fails to start leaves this one serving (its log says why).
void StartSuccessor(const std::string& exe, std::vector<std::string> args) {
  args.push_back("--takeover");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    // Only async-signal-safe calls from here to exec: this process has other threads' locks.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::setsid();
    if (::fork() == 0) {
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
    ::_exit(0);
  }
  if (child < 0) {
    Log(LogLevel::kError, "handover", "cannot start a successor",
        {F("error", std::strerror(errno))});
    return;
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  Log(LogLevel::kInfo, "handover", "SIGUSR2: started a successor to take over", {F("binary", exe)});
}

}  // namespace

int RunDaemon(int argc, char** argv, const TestHooks& hooks) {
  absl::SetProgramUsageMessage(
      "railyardd [--socket PATH] [flags]; every flag is also RAILYARD_<FLAG>");
  // Signals are taken synchronously by sigwait below, never by a handler on a random thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // What SIGUSR2 runs again: the path of this binary (resolved now, before an upgrade replaces
  // the file) and the arguments as given.
  std::string self_exe(4096, '\0');
  const ssize_t exe_len = ::readlink("/proc/self/exe", self_exe.data(), self_exe.size() - 1);
  self_exe.resize(exe_len > 0 ? static_cast<size_t>(exe_len) : 0);
  const std::vector<std::string> self_args(argv, argv + argc);
  std::signal(SIGPIPE, SIG_IGN);
  // Debian builds Abseil without NDEBUG, which leaves its mutex deadlock detection on: every
  // Lock() then updates a global lock-order graph (GraphCycles, under its own global lock), a
  // cost on every mutex of the data path. The sanitizer build keeps it (tests run there).
#if !defined(__SANITIZE_ADDRESS__)
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif

  if (absl::Status s =
          ApplyEnvironment([](const char* name) -> const char* { return std::getenv(name); });
      !s.ok()) {
    std::fprintf(stderr, "railyardd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // Before any thread starts (setenv), and before UCX reads its configuration.
  const std::vector<std::string> ucx_defaults = transport::SetUcxTcpDefaults();
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<DaemonConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "railyardd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (!config->cpus.empty()) {
    // Before the server starts a thread: each one inherits the set.
    if (absl::Status s = PinProcessToCpus(config->cpus); !s.ok()) {
      std::fprintf(stderr, "railyardd: --cpus=%s: %s\n",
                   topology::FormatCpuList(config->cpus).c_str(), std::string(s.message()).c_str());
      return 2;
    }
    Log(LogLevel::kInfo, "daemon", "pinned to CPUs",
        {F("cpus", topology::FormatCpuList(config->cpus))});
  }
  if (absl::Status s = CheckTestFlags(*config, hooks); !s.ok()) {
    std::fprintf(stderr, "railyardd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (config->test_flip_bit_every > 0) {
    Log(LogLevel::kWarning, "daemon",
        "TEST ONLY fault injection on: one bit of every Nth inter-node message is flipped",
        {F("test_flip_bit_every", config->test_flip_bit_every)});
  }
  if (!ucx_defaults.empty()) {
    Log(LogLevel::kInfo, "daemon", "UCX tcp settings (the environment may override)",
        {F("set", absl::StrJoin(ucx_defaults, " "))});
  }
  Server server(*config, hooks);
  if (absl::Status s = server.Start(); !s.ok()) {
    Log(LogLevel::kError, "daemon", "cannot start", {F("reason", s.message())});
    return 1;
  }
  // Under systemd (Type=notify): serving. MAINPID too: after a takeover this process replaces
  // the one systemd started (NotifyAccess=all lets it say so).
  if (!SdNotify(absl::StrCat("MAINPID=", ::getpid(), "\nREADY=1"))) {
    Log(LogLevel::kWarning, "daemon", "could not notify systemd ($NOTIFY_SOCKET)");
  }
  int sig = 0;
  // SIGHUP reloads what can be reloaded (--job_weights); SIGUSR2 starts a successor that takes
  // the node over (an upgrade in place); SIGTERM and SIGINT stop.
  while (sigwait(&signals, &sig) == 0 && (sig == SIGHUP || sig == SIGUSR2)) {
    if (sig == SIGHUP) {
      server.Reload();
    } else if (self_exe.empty()) {
      Log(LogLevel::kError, "handover", "SIGUSR2: the path of this binary is unknown");
    } else {
      StartSuccessor(self_exe, self_args);
    }
  }
  Log(LogLevel::kInfo, "daemon", "signal received", {F("signal", sig)});
  server.Shutdown();
  return 0;
}

}  // namespace railyard
