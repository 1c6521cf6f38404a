// A real railyardd in a temporary directory, for integration tests.
#pragma once

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "railyard/client.h"
#include "railyard/v1/admin.grpc.pb.h"
#include "railyard/v1/local.grpc.pb.h"
#include "tests/integration/process.h"

namespace railyard::testing {

inline std::string MakeTempDir() {
  char tmpl[] = "/tmp/ryit-XXXXXX";  // short: Unix socket paths are limited to 107 bytes
  const char* dir = ::mkdtemp(tmpl);
  return dir == nullptr ? std::string("/tmp") : std::string(dir);
}

// The daemon binary: $RAILYARDD when set (a prebuilt bundle run on another machine, as
// scripts/device-check.sh does), else the one this build made.
inline std::string RailyarddPath() {
  const char* env = std::getenv("RAILYARDD");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(RAILYARDD_PATH);
}

// Flags only the test build of the daemon serves (daemon/test_hooks.h).
inline bool IsTestOnlyFlag(const std::string& flag) {
  return flag.rfind("--fake_gpus", 0) == 0 || flag.rfind("--test_flip_bit_every", 0) == 0;
}

// The daemon for these flags: the test build (railyardd-testing; $RAILYARDD_TESTING when set)
// when one of them is test-only, else RailyarddPath(), the binary that is installed.
inline std::string RailyarddPathFor(const std::vector<std::string>& flags) {
  for (const std::string& f : flags) {
    if (!IsTestOnlyFlag(f)) continue;
    const char* env = std::getenv("RAILYARDD_TESTING");
    return env != nullptr && *env != '\0' ? std::string(env) : std::string(RAILYARDD_TESTING_PATH);
  }
  return RailyarddPath();
}

inline bool SocketAccepts(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

class DaemonProcess {
 public:
  explicit DaemonProcess(std::vector<std::string> extra_flags = {}) : dir_(MakeTempDir()) {
    socket_ = dir_ + "/ry.sock";
    Start(std::move(extra_flags));
  }
  // SIGKILL, as an OOM kill or a liveness restart would: the socket file stays behind, stale.
  void Kill() {
    if (stopped_) return;
    stopped_ = true;
    proc_->Signal(SIGKILL);
    stop_code_ = proc_->Wait(std::chrono::seconds(15)).value_or(-1);
  }
  // Starts railyardd on this socket (again, after Stop or Kill) and waits until it accepts.
  void Start(std::vector<std::string> extra_flags = {}) {
    std::vector<std::string> argv = {RailyarddPathFor(extra_flags), "--socket=" + socket_,
                                     "--node_name=itest", "--insecure_first_session_token"};
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    proc_ = std::make_unique<Process>(argv, dir_ + "/railyardd.log");
    stopped_ = false;
    for (int i = 0; i < 1000 && !SocketAccepts(socket_); ++i) {
      if (proc_->Wait(std::chrono::milliseconds(10)).has_value()) break;
    }
  }
  ~DaemonProcess() {
    Stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // SIGTERM and wait; returns the exit code (or -1 when it had to be killed).
  int Stop() {
    if (stopped_) return stop_code_;
    stopped_ = true;
    proc_->Signal(SIGTERM);
    auto code = proc_->Wait(std::chrono::seconds(15));
    stop_code_ = code.value_or(-1);
    return stop_code_;
  }

  bool ready() const { return SocketAccepts(socket_); }
  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }
  Process& process() { return *proc_; }
  std::string Log() const { return proc_->Output(); }

  ClientOptions Options(const std::string& job = "itest", const std::string& token = "") const {
    ClientOptions o;
    o.socket = socket_;
    o.job = job;
    o.token = token;
    return o;
  }

  std::shared_ptr<grpc::Channel> Channel() const {
    return grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
  }

  // The operators' socket (the daemon's default: <socket>.admin).
  std::shared_ptr<grpc::Channel> AdminChannel() const {
    return grpc::CreateChannel("unix:" + socket_ + ".admin", grpc::InsecureChannelCredentials());
  }

  v1::StatusResponse Status() const {
    auto stub = v1::Admin::NewStub(AdminChannel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::StatusResponse resp;
    grpc::Status s = stub->Status(&ctx, v1::StatusRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

 private:
  std::string dir_;
  std::string socket_;
  std::unique_ptr<Process> proc_;
  bool stopped_ = false;
  int stop_code_ = -1;
};

}  // namespace railyard::testing
