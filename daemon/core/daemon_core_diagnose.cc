// Hang diagnosis: this daemon's view of its communicators' progress (Admin.GetCommState,
// Peer.GetCommState) and the verdict gathered across a communicator's daemons
// (Admin.Diagnose, railctl diagnose).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/daemon_core.h"
#include "daemon/diagnose/verdicts.h"
#include "daemon/util/log.h"

namespace railyard {

namespace {

constexpr uint32_t kDefaultDiagnoseTimeoutMs = 2000;
constexpr uint32_t kMaxDiagnoseTimeoutMs = 30000;
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

v1::CommState DaemonCore::LocalCommState(const std::shared_ptr<Communicator>& comm) {
  v1::CommState st = comm->ProgressState();
  if (st.node_name().empty()) st.set_node_name(config_.node_name);
  for (const auto& session : sessions_.Snapshot()) {
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

absl::StatusOr<v1::GetCommStateResponse> DaemonCore::GetCommState(
    const v1::GetCommStateRequest& req) {
  v1::GetCommStateResponse out;
  for (const auto& comm : comms_.Snapshot()) {
    if (Matches(*comm, req.comm_id(), req.job_id())) *out.add_comms() = LocalCommState(comm);
  }
  if (out.comms_size() == 0 && (!req.comm_id().empty() || !req.job_id().empty())) {
    return NoneMatches(req.comm_id(), req.job_id());
  }
  return out;
}

absl::StatusOr<v1::CommState> DaemonCore::PeerCommState(const PeerIdentity& who,
                                                        const v1::PeerCommStateRequest& req) {
  absl::StatusOr<std::shared_ptr<Communicator>> member =
      PeerMemberComm(who, "GetCommState", "PeerCommStateRequest.from_node", req.job_id(),
                     req.comm_id(), req.from_node());
  if (!member.ok()) return member.status();
  return LocalCommState(*member);
}

void DaemonCore::Diagnose(const v1::DiagnoseRequest& req,
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
  for (const auto& comm : comms_.Snapshot()) {
    if (Matches(*comm, req.comm_id(), req.job_id())) comms.push_back(comm);
  }
  if (comms.empty()) {
    done(NoneMatches(req.comm_id(), req.job_id()));
    return;
  }

  // Every member daemon of every communicator is asked at once; the last answer (or deadline)
  // judges and replies.
  struct Gather {
    absl::Mutex mu;
    std::vector<std::vector<v1::CommState>> states;  // by communicator
    std::vector<std::vector<diagnose::Unanswered>> silent;
    size_t outstanding = 0;
    std::function<void(const absl::StatusOr<v1::DiagnoseResponse>&)> done;
    absl::Duration stall;
  };
  auto g = std::make_shared<Gather>();
  g->states.resize(comms.size());
  g->silent.resize(comms.size());
  g->done = std::move(done);
  g->stall = stall;
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
      a.req.set_from_node(config_.node_name);
      asks.push_back(std::move(a));
    }
  }
  auto finish = [](const std::shared_ptr<Gather>& g) {
    v1::DiagnoseResponse out;
    for (size_t c = 0; c < g->states.size(); ++c) {
      *out.add_comms() = diagnose::Diagnose(g->states[c], g->silent[c], g->stall);
    }
    g->done(out);
  };
  if (asks.empty()) {
    finish(g);
    return;
  }
  g->outstanding = asks.size();
  const double timeout_s = absl::ToDoubleSeconds(timeout);
  for (const Ask& a : asks) {
    peers_.GetCommState(a.address, a.name, a.req, timeout,
                        [g, a, timeout_s, finish](const absl::StatusOr<v1::CommState>& st) {
                          bool last;
                          {
                            absl::MutexLock lock(&g->mu);
                            if (st.ok()) {
                              g->states[a.comm].push_back(*st);
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
