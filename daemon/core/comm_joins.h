// How ranks join communicators. A rank's InitComm: its comm id and rank are checked, this daemon
// asks the comm id's coordinator for the layout (its own bootstrap, or another daemon's over
// Peer.JoinComm), checks what comes back, builds this node's communicator once for all its local
// ranks (CommFactory, outside every lock: UCX connects may take --peer_timeout per peer and rail;
// the other local ranks wait for it without blocking) and joins the rank to it. And the
// coordinator's side: other daemons' joins (Peer.JoinComm), checked before anything is stored.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/comm/bootstrap.h"
#include "daemon/comm/comm_registry.h"
#include "daemon/comm/peer_client.h"
#include "daemon/comm/peer_identity.h"
#include "daemon/config.h"
#include "daemon/core/comm_factory.h"
#include "daemon/core/fair_share.h"
#include "daemon/core/peer_plane.h"
#include "daemon/core/tuning.h"
#include "daemon/scheduler/tags.h"
#include "daemon/session/session.h"
#include "daemon/transport/transport.h"
#include "railyard/v1/local.pb.h"
#include "railyard/v1/peer.pb.h"

namespace railyard {

class CommJoins {
 public:
  // handle: the rank's communicator handle; nnodes: the daemons the communicator spans (0 on
  // error).
  // first_seq: InitCommResponse.first_seq (the communicator's next collective).
  using InitDone =
      std::function<void(const absl::Status&, uint64_t handle, int nnodes, uint64_t first_seq)>;
  // Everything here must outlive this object (the daemon's members).
  struct Deps {
    CommRegistry* comms = nullptr;
    CommFactory* factory = nullptr;
    CommBootstrap* bootstrap = nullptr;
    PeerCalls* peers = nullptr;
    PeerPlane* peer_plane = nullptr;  // told which nodes' communicators are being built
    Tuning* tuning = nullptr;         // the cost model of one-node communicators
    FairShare* fair_share = nullptr;  // this node's paced chunk size, in its NodeInfo
  };
  CommJoins(const DaemonConfig& config, Deps deps);
  CommJoins(const CommJoins&) = delete;
  CommJoins& operator=(const CommJoins&) = delete;

  // Multi-node set-up, before serving: the transport and the address other daemons reach this
  // one's Peer service at, which comm ids coordinated here name from then on.
  void SetFabric(transport::Transport* transport, std::string peer_address);
  // Name written into comm ids as coordinator ("local:<node>" without a peer service).
  const std::string& coordinator() const { return coordinator_; }
  const std::string& peer_address() const { return peer_address_; }
  std::string NewCommId() const;
  // This daemon as other daemons see it.
  v1::NodeInfo MyNodeInfo() const;

  // Coordinator side (Peer.JoinComm from the daemon `who`, or a local rank's InitComm with
  // PeerIdentity::Self()). Everything is checked before anything is stored (CheckJoinRequest:
  // INVALID_ARGUMENT naming the field, PERMISSION_DENIED when `who` may not speak for the node),
  // then CommBootstrap::Join (PERMISSION_DENIED for a comm id of another job,
  // RESOURCE_EXHAUSTED past --max_pending_joins); it waits at most --join_timeout.
  absl::Status CoordinateJoin(const PeerIdentity& who, const v1::JoinCommRequest& req,
                              CommBootstrap::Done done);
  // Joins a communicator; done runs once every rank has joined or the join failed. Errors found
  // at once are returned and done is not called.
  absl::Status InitComm(const std::shared_ptr<Session>& session, const v1::InitCommRequest& req,
                        InitDone done);
  // Joins from now on are refused (UNAVAILABLE); a layout that arrives fails its rank's join.
  void Shutdown();

 private:
  bool shutting_down() const;
  // A join's wait for the other ranks: the request's, else --init_timeout; never more than
  // --join_timeout.
  absl::Duration JoinTimeout(uint32_t timeout_ms) const;
  void OnLayout(const std::weak_ptr<Session>& session, const v1::InitCommRequest& req,
                uint64_t handle, std::shared_ptr<const scheduler::tags::Slot> slot,
                const absl::StatusOr<v1::JoinCommResponse>& layout, InitDone done);
  void JoinBuilt(const std::weak_ptr<Session>& session, const v1::InitCommRequest& req,
                 uint64_t handle, int nnodes,
                 const absl::StatusOr<std::shared_ptr<Communicator>>& comm, InitDone done);

  const DaemonConfig& config_;
  const Deps deps_;
  transport::Transport* transport_ = nullptr;
  std::string peer_address_;
  std::string coordinator_;
  std::atomic<uint64_t> next_handle_{1};
  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace railyard
