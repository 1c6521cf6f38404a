// Calls to other daemons' Peer services, over one cached channel per address.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "railyard/v1/peer.grpc.pb.h"

namespace railyard {

class PeerClients {
 public:
  using JoinDone = std::function<void(const absl::StatusOr<v1::JoinCommResponse>&)>;

  // Asynchronous; done runs on a gRPC thread. UNAVAILABLE names the address when the
  // coordinator cannot be reached.
  void JoinComm(const std::string& address, const v1::JoinCommRequest& req, absl::Duration timeout,
                JoinDone done);
  // Fire and forget (best effort: the peer also finds out through its own deadlines).
  void AbortComm(const std::string& address, const v1::AbortCommRequest& req);
  // Asynchronous liveness probe; done(OK) when the peer answered within timeout.
  void Heartbeat(const std::string& address, const std::string& from_node, absl::Duration timeout,
                 std::function<void(const absl::Status&)> done);

 private:
  v1::Peer::Stub* Stub(const std::string& address);

  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<v1::Peer::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard
