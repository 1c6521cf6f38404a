// What client_core.cc and client_rebuild.cc share: the client core's constants and one session
// with one daemon (ClientCore::Link).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "client_core.h"
#include "client_rings.h"
#include "fd_channel_client.h"
#include "railyard/v1/local.grpc.pb.h"

namespace railyard {
namespace internal {

// Deadline of every unary call but InitComm.
constexpr std::chrono::milliseconds kRpcTimeout{30000};
// InitComm waits for the other ranks: its own timeout plus this margin, or kInitDefaultTimeout
// when the daemon's default applies (its value is not known here).
constexpr std::chrono::milliseconds kInitMargin{5000};
constexpr std::chrono::milliseconds kInitDefaultTimeout{10 * 60 * 1000};
// How long Shutdown waits for the daemon to acknowledge Disconnect.
constexpr std::chrono::milliseconds kDisconnectTimeout{5000};
// Waits longer than this are treated as unbounded (avoids overflowing time_point arithmetic).
constexpr std::chrono::milliseconds kForever{std::chrono::hours(24 * 365)};
// How long a session is waited for after a handover at least, whatever $RAILYARD_RECONNECT_S.
constexpr std::chrono::seconds kHandoverWindow{60};
// A reconnect's Connect attempts: each bounded by this, and this far apart.
constexpr std::chrono::milliseconds kReconnectAttempt{5000};
constexpr std::chrono::milliseconds kReconnectPause{50};
// The daemon's marker of a request handed back untaken (grpc error_details of Submit).
constexpr char kMovedDetails[] = "railyard.dev/moved";

inline bool IsCollective(const v1::SubmitRequest& r) {
  return r.op() != v1::COLLECTIVE_OP_SEND && r.op() != v1::COLLECTIVE_OP_RECV;
}

}  // namespace internal

// One session with one daemon. The fields below `stream` are guarded by the core's mu_.
struct ClientCore::Link {
  std::string session_id;
  std::string node_name;
  std::unique_ptr<internal::FdChannelClient> fd_channel;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Local::Stub> stub;
  grpc::ClientContext stream_ctx;
  std::unique_ptr<grpc::ClientReader<v1::SessionEvent>> stream;
  std::thread reader;
  std::shared_ptr<internal::ClientRings> rings;  // set once, right after Connected
  bool connected = false;                        // the Connected event arrived
  bool ended = false;                            // the reader saw the end of the stream
  bool moving = false;  // the daemon said it hands the node over (SessionEvent.moving)
  absl::Status end;     // why the stream ended (valid once ended)

  ~Link() {
    if (!reader.joinable()) return;
    stream_ctx.TryCancel();
    if (reader.get_id() == std::this_thread::get_id()) {
      reader.detach();  // the reader held the last reference: it is returning
    } else {
      reader.join();
    }
  }
};

}  // namespace railyard
