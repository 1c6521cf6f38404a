#include "daemon/core/comm_joins.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/comm/comm_id.h"
#include "daemon/comm/peer_input.h"
#include "daemon/session/quota.h"
#include "daemon/transport/integrity.h"
#include "daemon/util/log.h"
#include "daemon/util/random_id.h"

namespace railyard {

CommJoins::CommJoins(const DaemonConfig& config, Deps deps)
    : config_(config),
      deps_(deps),
      coordinator_(config.peer_listen.empty() ? absl::StrCat("local:", config.node_name)
                                              : config.peer_listen) {}

void CommJoins::SetFabric(transport::Transport* transport, std::string peer_address) {
  transport_ = transport;
  peer_address_ = std::move(peer_address);
  coordinator_ = peer_address_;
}

void CommJoins::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
}

bool CommJoins::shutting_down() const {
  absl::MutexLock lock(&mu_);
  return shutting_down_;
}

std::string CommJoins::NewCommId() const { return FormatCommId({RandomHex128(), coordinator_}); }

absl::Duration CommJoins::JoinTimeout(uint32_t timeout_ms) const {
  // Whoever asks (a client, or a peer daemon relaying one) may ask for less than --join_timeout,
  // never more: a join's state must not be held for 49 days.
  const absl::Duration asked =
      timeout_ms == 0 ? config_.init_timeout : absl::Milliseconds(timeout_ms);
  return std::min(asked, config_.join_timeout);
}

v1::NodeInfo CommJoins::MyNodeInfo() const {
  v1::NodeInfo info;
  info.set_node_name(config_.node_name);
  info.set_peer_address(peer_address_);
  if (transport_ != nullptr) {
    for (int r = 0; r < transport_->num_rails(); ++r) {
      absl::StatusOr<std::string> addr = transport_->LocalAddress(r);
      info.add_rail_addresses(addr.ok() ? *addr : std::string());
    }
  }
  info.set_paced_chunk_bytes(deps_.fair_share->PacedChunkBytes());
  info.set_data_plane_version(kDataPlaneVersion);
  return info;
}

absl::Status CommJoins::CoordinateJoin(const PeerIdentity& who, const v1::JoinCommRequest& req,
                                       CommBootstrap::Done done) {
  if (shutting_down()) return absl::UnavailableError("railyardd is shutting down");
  if (absl::Status s = CheckJoinRequest(who, req, coordinator_); !s.ok()) {
    Log(LogLevel::kWarning, "peer", "join refused",
        {F("peer", who.peer), F("code", absl::StatusCodeToString(s.code())),
         F("reason", s.message())});
    return s;
  }
  return deps_.bootstrap->Join(req, JoinTimeout(req.timeout_ms()), std::move(done));
}

absl::Status CommJoins::InitComm(const std::shared_ptr<Session>& session,
                                 const v1::InitCommRequest& req, InitDone done) {
  absl::StatusOr<CommId> id = ParseCommId(req.comm_id());
  if (!id.ok()) return id.status();
  if (absl::Status s = CheckRankOf(req.rank(), req.nranks()); !s.ok()) return s;
  // Refuse early what AddMembership would refuse after the other ranks joined.
  if (session->quota() != nullptr) {
    if (absl::Status s = session->quota()->CheckBelow(Resource::kComms); !s.ok()) return s;
  }
  const bool local_coordinator = id->coordinator == coordinator_;
  if (!local_coordinator && IsLocalCoordinator(id->coordinator)) {
    // Another daemon without a peer service: nothing to dial (and never a gRPC "local:" target).
    return absl::InvalidArgumentError(
        absl::StrCat("comm id names coordinator ", id->coordinator,
                     ", a daemon without a peer service that is not this one (", coordinator_,
                     "): create the comm id on a daemon with --peer_listen"));
  }
  if (!local_coordinator && peer_address_.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "comm id names coordinator ", id->coordinator, " but this daemon is ", coordinator_,
        " and has no --peer_listen: communicators spanning daemons need the peer service"));
  }
  const CommRegistry::Key key(session->job(), req.comm_id());
  if (shutting_down()) return absl::UnavailableError("railyardd is shutting down");
  if (auto existing = deps_.comms->Find(key);
      existing != nullptr && !existing->failed() && existing->HasJoined(req.rank())) {
    return absl::AlreadyExistsError(
        absl::StrCat("rank ", req.rank(), " has already joined communicator ", req.comm_id()));
  }
  // The local ranks of one communicator share this daemon's tag slot for it.
  std::shared_ptr<const scheduler::tags::Slot> slot;
  if (transport_ != nullptr) {
    absl::StatusOr<std::shared_ptr<const scheduler::tags::Slot>> got =
        deps_.comms->BootstrapSlot(key);
    if (!got.ok()) return got.status();
    slot = *std::move(got);
  }
  // What this member asks for on the wire: the stronger of the daemon's and the rank's.
  absl::StatusOr<transport::Integrity> asked = AskedIntegrity(config_.integrity, req.integrity());
  if (!asked.ok()) return asked.status();
  const uint64_t handle = next_handle_.fetch_add(1);
  v1::JoinCommRequest join;
  join.set_job_id(session->job());
  join.set_comm_id(req.comm_id());
  join.set_rank(req.rank());
  join.set_nranks(req.nranks());
  join.set_timeout_ms(req.timeout_ms());
  join.set_integrity(std::string(transport::IntegrityName(*asked)));
  *join.mutable_node() = MyNodeInfo();
  if (slot != nullptr) join.mutable_node()->set_tag_slot(slot->value());
  std::weak_ptr<Session> weak_session = session;
  auto on_layout = [this, key, weak_session, req, handle, slot,
                    done](const absl::StatusOr<v1::JoinCommResponse>& layout) {
    deps_.comms->EndBootstrap(key);  // the communicator (or nothing) holds the slot from now on
    OnLayout(weak_session, req, handle, slot, layout, done);
  };
  if (!local_coordinator) {
    // A little past the coordinator's own wait (so its answer, e.g. which rank is missing, wins)
    // but within the client's InitComm margin (5 s), so that the rank hears why (a coordinator
    // not reached: down, or a TLS handshake failing) rather than the client's own timeout.
    deps_.peers->JoinComm(id->coordinator, join, JoinTimeout(req.timeout_ms()) + absl::Seconds(2),
                          std::move(on_layout));
    return absl::OkStatus();
  }
  return CoordinateJoin(PeerIdentity::Self(), join, std::move(on_layout));
}

void CommJoins::OnLayout(const std::weak_ptr<Session>& weak_session, const v1::InitCommRequest& req,
                         uint64_t handle, std::shared_ptr<const scheduler::tags::Slot> slot,
                         const absl::StatusOr<v1::JoinCommResponse>& layout, InitDone done) {
  std::shared_ptr<Session> session = weak_session.lock();
  if (session == nullptr) {
    done(absl::CancelledError("the session ended while joining"), handle, 0, 0);
    return;
  }
  if (!layout.ok()) {
    done(layout.status(), handle, 0, 0);
    return;
  }
  // From another daemon (untrusted) unless this one coordinates: checked before anything is
  // indexed, sized or dialled with it.
  LayoutAsk ask;
  ask.comm_id = req.comm_id();
  ask.rank = req.rank();
  ask.nranks = req.nranks();
  ask.is_me = [this](const v1::NodeInfo& node) {
    return peer_address_.empty() ? node.node_name() == config_.node_name
                                 : node.peer_address() == peer_address_;
  };
  absl::StatusOr<int> checked = CheckLayoutFromCoordinator(*layout, ask);
  if (!checked.ok()) {
    Log(LogLevel::kWarning, "comm", "layout refused",
        {F("comm", req.comm_id()), F("reason", checked.status().message())});
    done(checked.status(), handle, 0, 0);
    return;
  }
  const int my_node = *checked;
  const int nnodes = layout->nodes_size();
  const auto key = std::make_pair(session->job(), req.comm_id());
  auto join = [this, weak_session, req, handle, nnodes,
               done](const absl::StatusOr<std::shared_ptr<Communicator>>& comm) {
    JoinBuilt(weak_session, req, handle, nnodes, comm, done);
  };
  if (shutting_down()) {
    done(absl::UnavailableError("railyardd is shutting down"), handle, 0, 0);
    return;
  }
  std::shared_ptr<Communicator> comm;
  switch (deps_.comms->FindOrClaim(key, join, &comm)) {
    case CommRegistry::Claim::kFound:
      join(comm);
      return;
    case CommRegistry::Claim::kWaiting:  // another local rank is building it
      return;
    case CommRegistry::Claim::kBuild:
      break;
  }
  // Built outside every lock: UCX connects may take --peer_timeout per peer and rail.
  absl::StatusOr<std::shared_ptr<Communicator>> made;
  // Multi-node: the other nodes, which may heartbeat this daemon before the communicator is
  // registered (they built theirs first): answered while it is being built.
  std::vector<std::string> others;
  if (nnodes == 1) {
    made = deps_.factory->MakeLocal(session->job(), req.comm_id(), req.nranks(),
                                    deps_.tuning->CostModel());
  } else {
    for (int n = 0; n < nnodes; ++n) {
      if (n != my_node) others.push_back(layout->nodes(n).node_name());
    }
    deps_.peer_plane->CountBuilding(others, +1);
    made = deps_.factory->MakeMultiNode(session->job(), req.comm_id(), *layout, my_node,
                                        std::move(slot), req.integrity());
  }
  std::vector<CommRegistry::BuiltFn> waiters = deps_.comms->Built(key, made);
  deps_.peer_plane->CountBuilding(others, -1);  // registered (or failed) from here on
  join(made);
  for (auto& w : waiters) w(made);
}

void CommJoins::JoinBuilt(const std::weak_ptr<Session>& weak_session,
                          const v1::InitCommRequest& req, uint64_t handle, int nnodes,
                          const absl::StatusOr<std::shared_ptr<Communicator>>& made,
                          InitDone done) {
  if (!made.ok()) {
    done(made.status(), handle, 0, 0);
    return;
  }
  std::shared_ptr<Session> session = weak_session.lock();
  if (session == nullptr) {
    done(absl::CancelledError("the session ended while joining"), handle, 0, 0);
    return;
  }
  const std::shared_ptr<Communicator>& comm = *made;
  if (comm->nranks() != req.nranks()) {
    done(absl::InvalidArgumentError(absl::StrCat("communicator ", req.comm_id(), " has ",
                                                 comm->nranks(), " ranks, rank ", req.rank(),
                                                 " asked for ", req.nranks())),
         handle, 0, 0);
    return;
  }
  if (absl::Status s = session->AddMembership(handle, {comm, req.rank()}); !s.ok()) {
    done(s, handle, 0, 0);
    return;
  }
  std::weak_ptr<Communicator> weak_comm = comm;
  absl::Status s = comm->Join(
      req.rank(), config_.init_timeout,
      [done, handle, nnodes, weak_session, weak_comm](const absl::Status& status) {
        if (!status.ok()) {
          if (auto sess = weak_session.lock()) sess->RemoveMembership(handle);
        }
        const std::shared_ptr<Communicator> joined = weak_comm.lock();
        const uint64_t first_seq = status.ok() && joined != nullptr ? joined->first_seq() : 0;
        done(status, handle, status.ok() ? nnodes : 0, first_seq);
      },
      req.resume_seq());
  if (!s.ok()) {
    session->RemoveMembership(handle);
    if (comm->all_left()) deps_.comms->Retire(comm);
    done(s, handle, 0, 0);
    return;
  }
  Log(LogLevel::kDebug, "comm", "rank joined",
      {F("comm", req.comm_id()), F("rank", req.rank()), F("nranks", req.nranks()),
       F("nodes", nnodes)});
}

}  // namespace railyard
