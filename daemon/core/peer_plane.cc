#include "daemon/core/peer_plane.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/comm/peer_input.h"
#include "daemon/diagnose/census.h"
#include "daemon/diagnose/rail_check.h"
#include "daemon/diagnose/verdicts.h"
#include "daemon/util/log.h"

namespace railyard {

namespace {

constexpr uint32_t kDefaultDiagnoseTimeoutMs = 2000;
constexpr uint32_t kMaxDiagnoseTimeoutMs = 30000;
// How long a rail check waits for the peer's view (Communicator::SuspectRail).
constexpr absl::Duration kRailCheckTimeout = absl::Seconds(2);
constexpr uint32_t kDefaultStallMs = 1000;

bool Matches(const Communicator& comm, const std::string& comm_id, const std::string& job) {
  return (comm_id.empty() || comm.comm_id() == comm_id) && (job.empty() || comm.job() == job);
}

// NOT_FOUND for a comm id and/or job that match no communicator here.
absl::Status NoneMatches(const std::string& comm_id, const std::string& job) {
  std::vector<std::string> what;
  if (!comm_id.empty()) what.push_back(absl::StrCat("comm id ", comm_id.substr(0, 80)));
  if (!job.empty()) what.push_back(absl::StrCat("job ", job.substr(0, 80)));
  return absl::NotFoundError(
      absl::StrCat("no communicator here matches ", absl::StrJoin(what, " and ")));
}

}  // namespace

PeerPlane::PeerPlane(Options options, Deps deps) : options_(std::move(options)), deps_(deps) {}

void PeerPlane::Start() {
  absl::MutexLock lock(&mu_);
  if (started_ || stopped_) return;
  started_ = true;
  timer_id_ =
      deps_.timer->Schedule(deps_.timer->Now() + options_.heartbeat_interval, [this] { Tick(); });
}

void PeerPlane::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  deps_.timer->Cancel(timer_id_);
}

absl::StatusOr<std::shared_ptr<Communicator>> PeerPlane::MemberComm(
    const PeerIdentity& who, absl::string_view rpc, absl::string_view field, const std::string& job,
    const std::string& comm_id, const std::string& from_node) {
  if (absl::Status s = CheckClaimedNode(who, from_node, field); !s.ok()) return s;
  std::shared_ptr<Communicator> comm = deps_.comms->Find({job, comm_id});
  if (comm == nullptr || !comm->HasPeerNode(from_node)) {
    return absl::PermissionDeniedError(absl::StrCat(
        rpc, " from node ", from_node, " refused: it is not another member node of communicator ",
        comm_id.substr(0, 80), " here"));
  }
  return comm;
}

absl::Status PeerPlane::AbortFromPeer(const PeerIdentity& who, const v1::AbortCommRequest& req) {
  // Only another member may fail a communicator.
  absl::StatusOr<std::shared_ptr<Communicator>> member = MemberComm(
      who, "AbortComm", "AbortCommRequest.from_node", req.job_id(), req.comm_id(), req.from_node());
  if (!member.ok()) return member.status();
  const std::shared_ptr<Communicator>& comm = *member;
  // A peer's code and words go to every local rank: only real codes, and a bounded message.
  const bool known =
      req.code() > 0 && req.code() <= static_cast<int>(absl::StatusCode::kUnauthenticated);
  const auto code = known ? static_cast<absl::StatusCode>(req.code()) : absl::StatusCode::kAborted;
  if (req.departed_ranks_size() > 0) {
    // Ranks that left cleanly: only the sender's own, each once.
    if (req.departed_ranks_size() > comm->nranks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("AbortCommRequest.departed_ranks: ", req.departed_ranks_size(),
                       " ranks for a ", comm->nranks(), "-rank communicator"));
    }
    std::vector<int> ranks;
    for (int32_t r : req.departed_ranks()) {
      const int node = comm->NodeOfRank(r);
      if (node < 0 || comm->node_names()[static_cast<size_t>(node)] != req.from_node()) {
        return absl::InvalidArgumentError(absl::StrCat("AbortCommRequest.departed_ranks: rank ", r,
                                                       " of communicator ", req.comm_id(),
                                                       " is not a rank of node ", req.from_node()));
      }
      ranks.push_back(r);
    }
    comm->RanksDeparted(ranks, absl::Status(code, req.message().substr(0, 1024)));
    return absl::OkStatus();
  }
  // unrun_seq only hastens failing this daemon's transfers of a communicator that fails anyway.
  comm->Abort(absl::Status(code, req.message().substr(0, 1024)),
              /*notify=*/false, /*transfers_now=*/false,
              req.has_unrun_seq() ? std::optional<uint64_t>(req.unrun_seq()) : std::nullopt);
  return absl::OkStatus();
}

bool PeerPlane::SharesCommWith(const std::string& node) {
  {
    absl::MutexLock lock(&mu_);
    if (building_.count(node) > 0) return true;
  }
  for (const auto& comm : deps_.comms->Snapshot()) {
    if (comm->multi_node() && !comm->failed() && comm->HasPeerNode(node)) return true;
  }
  return false;
}

absl::StatusOr<v1::HeartbeatResponse> PeerPlane::Heartbeat(const PeerIdentity& who,
                                                           const v1::HeartbeatRequest& req) {
  if (absl::Status s = CheckClaimedNode(who, req.from_node(), "HeartbeatRequest.from_node");
      !s.ok()) {
    return s;
  }
  if (!SharesCommWith(req.from_node())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "Heartbeat from node ", req.from_node(),
        " refused: it is not another node of a multi-node communicator of this daemon (yet)"));
  }
  v1::HeartbeatResponse resp;
  resp.set_node_name(options_.node_name);
  return resp;
}

void PeerPlane::CountBuilding(const std::vector<std::string>& nodes, int delta) {
  absl::MutexLock lock(&mu_);
  for (const auto& name : nodes) {
    if ((building_[name] += delta) <= 0) building_.erase(name);
  }
}

void PeerPlane::Tick() {
  // The peers live communicators need, gathered before mu_ (each comm takes its own lock).
  std::map<std::string, std::vector<std::shared_ptr<Communicator>>> by_peer;
  std::vector<std::shared_ptr<Communicator>> live;
  for (const auto& comm : deps_.comms->Snapshot()) {
    if (!comm->multi_node() || comm->failed()) continue;
    for (const auto& addr : comm->LivePeerAddresses()) by_peer[addr].push_back(comm);
    live.push_back(comm);
  }
  std::vector<std::pair<std::string, std::string>> dead;  // (address, last error)
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || !started_) return;
    const absl::Time now = deps_.timer->Now();
    for (const auto& [addr, comms] : by_peer) {
      last_seen_.try_emplace(addr, now);  // a new peer gets a full timeout
    }
    for (auto it = last_seen_.begin(); it != last_seen_.end();) {
      if (by_peer.count(it->first) == 0) {  // no live communicator needs this peer any more
        last_error_.erase(it->first);
        it = last_seen_.erase(it);
        continue;
      }
      if (now - it->second > options_.peer_timeout) {
        dead.emplace_back(it->first, last_error_[it->first]);
      }
      ++it;
    }
    timer_id_ = deps_.timer->Schedule(now + options_.heartbeat_interval, [this] { Tick(); });
  }
  for (const auto& comm : live) CheckRails(comm);
  for (const auto& [addr, error] : dead) {
    if (deps_.metrics != nullptr) deps_.metrics->CountPeerFailure();
    for (const auto& comm : by_peer[addr]) {
      comm->Abort(absl::UnavailableError(absl::StrCat(
          "node ", comm->NodeNameOf(addr), " (", addr, ") of communicator ", comm->comm_id(),
          " has not answered for ", absl::FormatDuration(options_.peer_timeout),
          error.empty() ? "" : ": ", error)));
    }
  }
  for (const auto& [addr, comms] : by_peer) {
    // The node the layouts name at addr: its certificate must say so.
    deps_.peers->Heartbeat(addr, comms.front()->NodeNameOf(addr), options_.node_name,
                           options_.heartbeat_interval, [this, addr = addr](const absl::Status& s) {
                             absl::MutexLock lock(&mu_);
                             if (s.ok()) {
                               last_seen_[addr] = deps_.timer->Now();
                               last_error_.erase(addr);
                             } else {
                               last_error_[addr] = std::string(s.message());
                             }
                           });
  }
}

void PeerPlane::CheckRails(const std::shared_ptr<Communicator>& comm) {
  const std::optional<Communicator::RailSuspect> suspect =
      comm->SuspectRail(options_.rail_stall_timeout);
  if (!suspect) return;
  const int peer = suspect->stall.peer;
  if (peer < 0 || static_cast<size_t>(peer) >= comm->node_addresses().size() ||
      static_cast<size_t>(peer) >= comm->node_names().size()) {
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || !rail_checks_.insert(comm->comm_id()).second) return;  // one at a time
  }
  // The peer's view tells a rail that lost what it carried from a peer that is late.
  v1::PeerCommStateRequest req;
  req.set_job_id(comm->job());
  req.set_comm_id(comm->comm_id());
  req.set_from_node(options_.node_name);
  deps_.peers->GetCommState(
      comm->node_addresses()[peer], comm->node_names()[peer], req, kRailCheckTimeout,
      [this, comm, s = *suspect](const absl::StatusOr<v1::CommState>& view) {
        {
          absl::MutexLock lock(&mu_);
          rail_checks_.erase(comm->comm_id());
        }
        if (!view.ok()) return;  // a silent peer is the heartbeats' to judge
        const std::optional<std::string> evidence = diagnose::PeerConfirmsRailStall(
            *view, {s.seq, comm->my_node(), s.stall.rail,
                    absl::ToDoubleSeconds(options_.rail_stall_timeout)});
        if (evidence) comm->FailStalledRail(s, options_.rail_stall_timeout, *evidence);
      });
}

v1::CommState PeerPlane::LocalCommState(const std::shared_ptr<Communicator>& comm) {
  v1::CommState st = comm->ProgressState();
  if (st.node_name().empty()) st.set_node_name(options_.node_name);
  if (deps_.sessions == nullptr) return st;
  for (const auto& session : deps_.sessions->Snapshot()) {
    if (session->job() != comm->job()) continue;
    for (const auto& [handle, m] : session->Memberships()) {
      if (m.comm != comm) continue;
      for (v1::RankProgress& r : *st.mutable_ranks()) {
        if (r.rank() == m.rank) r.set_pid(session->pid());
      }
    }
  }
  return st;
}

absl::StatusOr<v1::GetCommStateResponse> PeerPlane::GetCommState(
    const v1::GetCommStateRequest& req) {
  v1::GetCommStateResponse out;
  for (const auto& comm : deps_.comms->Snapshot()) {
    if (Matches(*comm, req.comm_id(), req.job_id())) *out.add_comms() = LocalCommState(comm);
  }
  if (out.comms_size() == 0 && (!req.comm_id().empty() || !req.job_id().empty())) {
    return NoneMatches(req.comm_id(), req.job_id());
  }
  return out;
}

absl::StatusOr<v1::CommState> PeerPlane::PeerCommState(const PeerIdentity& who,
                                                       const v1::PeerCommStateRequest& req) {
  absl::StatusOr<std::shared_ptr<Communicator>> member =
      MemberComm(who, "GetCommState", "PeerCommStateRequest.from_node", req.job_id(), req.comm_id(),
                 req.from_node());
  if (!member.ok()) return member.status();
  return LocalCommState(*member);
}

void PeerPlane::Diagnose(const v1::DiagnoseRequest& req,
                         std::function<void(const absl::StatusOr<v1::DiagnoseResponse>&)> done) {
  if (req.comm_id().empty() && req.job_id().empty()) {
    done(absl::InvalidArgumentError("diagnose needs a comm id or a job id"));
    return;
  }
  if (req.timeout_ms() > kMaxDiagnoseTimeoutMs) {
    done(absl::InvalidArgumentError(absl::StrCat("timeout_ms ", req.timeout_ms(), " is past the ",
                                                 kMaxDiagnoseTimeoutMs, " ms limit")));
    return;
  }
  const absl::Duration timeout =
      absl::Milliseconds(req.timeout_ms() > 0 ? req.timeout_ms() : kDefaultDiagnoseTimeoutMs);
  const absl::Duration stall =
      absl::Milliseconds(req.stall_ms() > 0 ? req.stall_ms() : kDefaultStallMs);
  std::vector<std::shared_ptr<Communicator>> comms;
  for (const auto& comm : deps_.comms->Snapshot()) {
    if (Matches(*comm, req.comm_id(), req.job_id())) comms.push_back(comm);
  }
  if (comms.empty()) {
    done(NoneMatches(req.comm_id(), req.job_id()));
    return;
  }

  GatherViews(
      comms, timeout,
      [done = std::move(done), stall](std::vector<std::vector<v1::CommState>> states,
                                      std::vector<std::vector<diagnose::Unanswered>> silent) {
        v1::DiagnoseResponse out;
        for (size_t c = 0; c < states.size(); ++c) {
          *out.add_comms() = diagnose::Diagnose(states[c], silent[c], stall);
        }
        done(out);
      });
}

void PeerPlane::Census(const std::shared_ptr<Communicator>& comm, uint32_t timeout_ms,
                       const std::vector<int>& exclude,
                       std::function<void(const absl::StatusOr<v1::CommCensusResponse>&)> done) {
  if (timeout_ms > kMaxDiagnoseTimeoutMs) {
    done(absl::InvalidArgumentError(absl::StrCat("CommCensusRequest.timeout_ms ", timeout_ms,
                                                 " is past the ", kMaxDiagnoseTimeoutMs,
                                                 " ms limit")));
    return;
  }
  if (exclude.size() > static_cast<size_t>(comm->nranks())) {
    done(absl::InvalidArgumentError(absl::StrCat("CommCensusRequest.exclude: ", exclude.size(),
                                                 " ranks for a ", comm->nranks(),
                                                 "-rank communicator")));
    return;
  }
  for (int r : exclude) {
    if (r < 0 || r >= comm->nranks()) {
      done(absl::InvalidArgumentError(absl::StrCat("CommCensusRequest.exclude: rank ", r,
                                                   " not in [0, ", comm->nranks(), ")")));
      return;
    }
  }
  diagnose::CensusLayout layout;
  layout.nranks = comm->nranks();
  if (comm->multi_node()) {
    layout.node_names = comm->node_names();
    layout.node_addresses = comm->node_addresses();
    for (int r = 0; r < layout.nranks; ++r) layout.node_of_rank.push_back(comm->NodeOfRank(r));
  } else {
    layout.node_names = {options_.node_name};
    layout.node_addresses = {""};
    layout.node_of_rank.assign(static_cast<size_t>(layout.nranks), 0);
  }
  // "ry1-<nonce>@<coordinator>" (checked at InitComm), as the clients split it.
  const std::string& id = comm->comm_id();
  if (const size_t at = id.find('@'); at != std::string::npos) {
    layout.coordinator = id.substr(at + 1);
  }
  // An explicit shrink: the layout's every node, with the excluded ranks left (made before
  // `answer` takes the layout).
  std::vector<v1::CommState> excluded;
  if (!exclude.empty()) {
    const std::set<int> gone(exclude.begin(), exclude.end());
    excluded.resize(layout.node_names.size());
    for (size_t n = 0; n < excluded.size(); ++n) excluded[n].set_node_index(static_cast<int>(n));
    for (int r = 0; r < layout.nranks; ++r) {
      const int n = layout.node_of_rank[static_cast<size_t>(r)];
      if (n < 0 || static_cast<size_t>(n) >= excluded.size()) continue;
      v1::RankProgress* p = excluded[static_cast<size_t>(n)].add_ranks();
      p->set_rank(r);
      p->set_left(gone.count(r) > 0);
    }
  }
  const absl::Status failure = comm->error();
  auto answer = [layout = std::move(layout), failure, done = std::move(done)](
                    std::vector<std::vector<v1::CommState>> states,
                    std::vector<std::vector<diagnose::Unanswered>> silent) {
    const diagnose::Census c = diagnose::TakeCensus(layout, states[0], silent[0]);
    v1::CommCensusResponse out;
    for (int r : c.lost_ranks) out.add_lost_ranks(r);
    for (const std::string& n : c.lost_nodes) out.add_lost_nodes(n);
    out.set_coordinator(c.coordinator);
    out.set_failure_code(static_cast<int>(failure.code()));
    out.set_failure(std::string(failure.message()));
    done(out);
  };
  if (!exclude.empty()) {
    answer({std::move(excluded)}, {{}});
    return;
  }
  GatherViews({comm}, absl::Milliseconds(timeout_ms > 0 ? timeout_ms : kDefaultDiagnoseTimeoutMs),
              std::move(answer));
}

void PeerPlane::GatherViews(const std::vector<std::shared_ptr<Communicator>>& comms,
                            absl::Duration timeout, ViewsDone done) {
  // Every member daemon of every communicator is asked at once; the last answer (or deadline)
  // hands them over.
  struct Gather {
    absl::Mutex mu;
    std::vector<std::vector<v1::CommState>> states;  // by communicator
    std::vector<std::vector<diagnose::Unanswered>> silent;
    size_t outstanding = 0;
    ViewsDone done;
  };
  auto g = std::make_shared<Gather>();
  g->states.resize(comms.size());
  g->silent.resize(comms.size());
  g->done = std::move(done);
  struct Ask {
    size_t comm;
    int node;
    std::string name, address;
    v1::PeerCommStateRequest req;
  };
  std::vector<Ask> asks;
  for (size_t c = 0; c < comms.size(); ++c) {
    g->states[c].push_back(LocalCommState(comms[c]));
    const auto& names = comms[c]->node_names();
    const auto& addresses = comms[c]->node_addresses();
    for (int n = 0; n < static_cast<int>(addresses.size()); ++n) {
      if (n == comms[c]->my_node()) continue;
      Ask a;
      a.comm = c;
      a.node = n;
      a.name = n < static_cast<int>(names.size()) ? names[n] : absl::StrCat("node ", n);
      a.address = addresses[n];
      a.req.set_job_id(comms[c]->job());
      a.req.set_comm_id(comms[c]->comm_id());
      a.req.set_from_node(options_.node_name);
      asks.push_back(std::move(a));
    }
  }
  auto finish = [](const std::shared_ptr<Gather>& g) {
    g->done(std::move(g->states), std::move(g->silent));
  };
  if (asks.empty()) {
    finish(g);
    return;
  }
  g->outstanding = asks.size();
  const double timeout_s = absl::ToDoubleSeconds(timeout);
  for (const Ask& a : asks) {
    deps_.peers->GetCommState(
        a.address, a.name, a.req, timeout,
        [g, a, timeout_s, finish](const absl::StatusOr<v1::CommState>& st) {
          bool last;
          {
            absl::MutexLock lock(&g->mu);
            if (st.ok() && st->node_index() == a.node) {
              g->states[a.comm].push_back(*st);
            } else if (st.ok()) {
              g->silent[a.comm].push_back(
                  {a.node, a.name,
                   absl::StrCat("answered for node index ", st->node_index(), ", not ", a.node)});
            } else {
              std::string why = absl::StatusCodeToString(st.status().code());
              if (st.status().code() == absl::StatusCode::kDeadlineExceeded) {
                absl::StrAppend(&why, " after ", timeout_s, " s");
              } else {
                absl::StrAppend(&why, ": ", st.status().message().substr(0, 200));
              }
              g->silent[a.comm].push_back({a.node, a.name, why});
            }
            last = --g->outstanding == 0;
          }
          if (last) finish(g);
        });
  }
}

}  // namespace railyard
