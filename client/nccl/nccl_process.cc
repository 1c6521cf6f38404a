#include "client/nccl/nccl_process.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace railyard::nccl {
namespace {

thread_local std::string last_error;

absl::Mutex client_mu;
std::unique_ptr<Client>* client ABSL_GUARDED_BY(client_mu) = nullptr;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

absl::StatusOr<Client*> ProcessClient() {
  absl::MutexLock lock(&client_mu);
  // Never destroyed: torn down with the process, after every communicator (a static destructor
  // racing a rank's last call would be worse than the daemon noticing the exit).
  if (client == nullptr) client = new std::unique_ptr<Client>();
  if (*client != nullptr) return client->get();
  ClientOptions options;  // socket, job and token from RAILYARD_* (client.h)
  absl::StatusOr<std::unique_ptr<Client>> made = Client::Connect(options);
  if (!made.ok()) {
    // No daemon to talk to is the node's fault, not a peer's: NCCL's system error.
    return absl::ResourceExhaustedError(
        absl::StrCat("no railyardd session: ", made.status().message()));
  }
  *client = std::move(*made);
  return client->get();
}

const std::string& ForcedAlgorithm() {
  static const std::string* algo = [] {
    std::string v = absl::AsciiStrToLower(Env("NCCL_ALGO"));
    if (v == "ring" || v == "tree") return new std::string(v);
    if (!v.empty()) {
      Log(DebugLevel::kWarn, -1,
          absl::StrCat("NCCL_ALGO=", Env("NCCL_ALGO"),
                       " names no algorithm railyard has (it has Ring and Tree across nodes): "
                       "left to the daemon's tuner"));
    }
    return new std::string();
  }();
  return *algo;
}

ncclResult_t Fail(ncclResult_t r, const std::string& why) {
  last_error = why;
  Log(DebugLevel::kWarn, -1, why);
  return r;
}

const char* LastError() { return last_error.c_str(); }

DebugLevel Debug() {
  static const DebugLevel level = [] {
    const std::string v = absl::AsciiStrToUpper(Env("NCCL_DEBUG"));
    if (v == "VERSION") return DebugLevel::kVersion;
    if (v == "WARN") return DebugLevel::kWarn;
    if (v == "INFO") return DebugLevel::kInfo;
    if (v == "TRACE") return DebugLevel::kTrace;
    return DebugLevel::kNone;
  }();
  return level;
}

void Log(DebugLevel level, int rank, const std::string& message) {
  if (level == DebugLevel::kNone || Debug() < level) return;
  char host[64] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const char* name = level == DebugLevel::kWarn   ? "WARN"
                     : level == DebugLevel::kInfo ? "INFO"
                                                  : "TRACE";
  const std::string line =
      absl::StrCat(host, ":", ::getpid(), ":", static_cast<long>(::syscall(SYS_gettid)), " [",
                   rank < 0 ? 0 : rank, "] NCCL ", name, " ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

void LogVersionOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (Debug() >= DebugLevel::kVersion) {
      std::fprintf(stderr, "NCCL version %d.%d.%d+railyard-%s\n", NCCL_MAJOR, NCCL_MINOR,
                   NCCL_PATCH, RAILYARD_VERSION);
    }
  });
}

}  // namespace railyard::nccl
