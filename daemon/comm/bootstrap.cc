#include "daemon/comm/bootstrap.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "daemon/comm/comm_id.h"
#include "daemon/comm/peer_input.h"
#include "daemon/scheduler/tags.h"

namespace railyard {

std::string CommBootstrap::NodeId(const v1::NodeInfo& n) {
  return n.peer_address().empty() ? n.node_name() : n.peer_address();
}

absl::Status CommBootstrap::CheckLayoutFits(const v1::JoinCommResponse& layout,
                                            const std::string& comm_id) {
  if (layout.nodes_size() > scheduler::tags::kMaxNodes) {
    return absl::InvalidArgumentError(absl::StrCat("communicator ", comm_id, " spans ",
                                                   layout.nodes_size(), " nodes, more than the ",
                                                   scheduler::tags::kMaxNodes, " a tag can name"));
  }
  // Members build the communicator from node_of_rank and index nodes with it (DaemonCore::
  // MakeMultiNodeComm): every rank must be on a listed node and every listed node hold a rank.
  const int nodes = layout.nodes_size();
  if (layout.node_of_rank_size() < 1 || layout.node_of_rank_size() > scheduler::tags::kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("communicator ", comm_id, ": layout of ", layout.node_of_rank_size(),
                     " ranks, not in [1, ", scheduler::tags::kMaxRanks, "]"));
  }
  std::vector<bool> holds_rank(nodes, false);
  for (int r = 0; r < layout.node_of_rank_size(); ++r) {
    const int n = layout.node_of_rank(r);
    if (n < 0 || n >= nodes) {
      return absl::InvalidArgumentError(absl::StrCat("communicator ", comm_id, ": node_of_rank[", r,
                                                     "] is ", n, " but the layout has ", nodes,
                                                     " nodes"));
    }
    holds_rank[n] = true;
  }
  std::map<std::string, int> index;  // NodeId -> node: one daemon is one node of a layout
  for (int n = 0; n < nodes; ++n) {
    const auto [first, inserted] = index.emplace(NodeId(layout.nodes(n)), n);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("communicator ", comm_id, ": nodes ", first->second, " and ", n,
                       " of the layout are one daemon (", first->first.substr(0, 64), ")"));
    }
    if (!holds_rank[n]) {
      return absl::InvalidArgumentError(absl::StrCat("communicator ", comm_id, ": node ", n, " (",
                                                     layout.nodes(n).node_name().substr(0, 64),
                                                     ") of the layout holds no rank"));
    }
  }
  if (layout.nodes_size() > 1) {
    for (const v1::NodeInfo& n : layout.nodes()) {
      if (!n.has_tag_slot()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "communicator ", comm_id, " spans ", layout.nodes_size(), " nodes but node ",
            n.node_name(), " has no transport (no tag slot): it needs --peer_listen"));
      }
      if (n.tag_slot() >= (1u << scheduler::tags::kSlotBits)) {
        return absl::InvalidArgumentError(
            absl::StrCat("communicator ", comm_id, ": tag slot ", n.tag_slot(), " of node ",
                         n.node_name(), " does not fit ", scheduler::tags::kSlotBits, " bits"));
      }
    }
  }
  return absl::OkStatus();
}

v1::JoinCommResponse CommBootstrap::Layout(const std::vector<v1::NodeInfo>& node_of_each_rank) {
  v1::JoinCommResponse out;
  // A daemon is identified by its peer address (unique on a fabric), or its name when it has none.
  std::map<std::string, int> index;
  int rails = 1 << 30;
  for (size_t r = 0; r < node_of_each_rank.size(); ++r) {
    const v1::NodeInfo& n = node_of_each_rank[r];
    const std::string id = NodeId(n);
    auto [it, inserted] = index.emplace(id, out.nodes_size());
    if (inserted) {
      *out.add_nodes() = n;  // ranks are visited in order: nodes ordered by their lowest rank
      rails = std::min(rails, std::max(1, n.rail_addresses_size()));
    }
    out.add_node_of_rank(it->second);
  }
  out.set_rails(out.nodes_size() == 0 ? 1 : rails);
  return out;
}

void CommBootstrap::SetCostModel(const v1::CostModel& model) {
  absl::MutexLock lock(&mu_);
  cost_model_ = model;
}

size_t CommBootstrap::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

size_t CommBootstrap::pending_bytes() const {
  absl::MutexLock lock(&mu_);
  return pending_bytes_;
}

void CommBootstrap::RememberFormed(const std::string& comm_id, const std::string& job) {
  if (limits_.remembered_formed == 0) return;
  if (!formed_.emplace(comm_id, job).second) return;  // the same job formed it again
  formed_order_.push_back(comm_id);
  while (formed_order_.size() > limits_.remembered_formed) {
    formed_.erase(formed_order_.front());
    formed_order_.pop_front();
  }
}

absl::Status CommBootstrap::Join(const v1::JoinCommRequest& req, absl::Duration timeout,
                                 Done done) {
  if (absl::Status s = CheckRankOf(req.rank(), req.nranks()); !s.ok()) return s;
  if (req.node().has_tag_slot() && req.node().tag_slot() >= (1u << scheduler::tags::kSlotBits)) {
    return absl::InvalidArgumentError(absl::StrCat("tag slot ", req.node().tag_slot(), " of node ",
                                                   req.node().node_name(), " does not fit ",
                                                   scheduler::tags::kSlotBits, " bits"));
  }
  // Neither job id is named: the refused caller learns only that the id is taken.
  const auto foreign = [&req] {
    return absl::PermissionDeniedError(absl::StrCat(
        "communicator ", req.comm_id().substr(0, 300), " belongs to another job: rank ", req.rank(),
        " (node ", req.node().node_name().substr(0, 64), ") may not join it"));
  };
  const size_t bytes = req.node().ByteSizeLong();
  std::vector<Done> dones;
  absl::StatusOr<v1::JoinCommResponse> result;
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_.ok()) return stopped_;
    if (pending_bytes_ + bytes > limits_.max_pending_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the coordinator's pending communicator bootstraps hold ", pending_bytes_,
                       " bytes of node information; this join's ", bytes,
                       " more would pass its limit of ", limits_.max_pending_bytes));
    }
    if (const size_t held = job_bytes_.count(req.job_id()) ? job_bytes_[req.job_id()] : 0;
        limits_.max_pending_bytes_per_job != 0 &&
        held + bytes > limits_.max_pending_bytes_per_job) {
      return absl::ResourceExhaustedError(
          absl::StrCat("job ", req.job_id(), "'s pending communicator bootstraps hold ", held,
                       " bytes of node information on this coordinator; this join's ", bytes,
                       " more would pass its share of ", limits_.max_pending_bytes_per_job));
    }
    auto it = pending_.find(req.comm_id());
    if (it == pending_.end()) {
      if (auto f = formed_.find(req.comm_id()); f != formed_.end() && f->second != req.job_id()) {
        return foreign();
      }
      switch (job_pending_.Take(req.job_id())) {
        case CallerShares<std::string>::Refusal::kNone:
          break;
        case CallerShares<std::string>::Refusal::kCallerShare:
          return absl::ResourceExhaustedError(absl::StrCat(
              "job ", req.job_id(), " has ", job_pending_.of(req.job_id()),
              " communicator bootstraps waiting for ranks on this coordinator, its share "
              "(--max_pending_joins_per_job); other jobs are still served"));
        case CallerShares<std::string>::Refusal::kPool:
          return absl::ResourceExhaustedError(absl::StrCat(
              "the coordinator has ", job_pending_.total(),
              " communicator bootstraps waiting for ranks, its limit (--max_pending_joins)"));
      }
      it = pending_.try_emplace(req.comm_id()).first;
      Pending& p = it->second;
      p.job = req.job_id();
      p.nranks = req.nranks();
      p.generation = next_generation_++;
      const uint64_t gen = p.generation;
      p.timer = timer_->Schedule(timer_->Now() + timeout,
                                 [this, comm = req.comm_id(), gen] { OnDeadline(comm, gen); });
    } else if (it->second.job != req.job_id()) {
      return foreign();
    } else if (it->second.nranks != req.nranks()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "communicator ", req.comm_id(), " has ", it->second.nranks, " ranks, rank ", req.rank(),
          " (node ", req.node().node_name(), ") asked for ", req.nranks()));
    }
    Pending& p = it->second;
    if (p.joined.count(req.rank()) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("rank ", req.rank(), " has already joined communicator ", req.comm_id()));
    }
    // Every rank of one daemon announces the same tag slot (the daemon's for this communicator).
    const std::string node_id = NodeId(req.node());
    const int64_t slot = req.node().has_tag_slot() ? req.node().tag_slot() : -1;
    auto [slot_it, first_of_node] = p.node_slots.emplace(node_id, slot);
    if (!first_of_node && slot_it->second != slot) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", req.rank(), " of communicator ", req.comm_id(), " announces tag slot ", slot,
          " for node ", req.node().node_name(), ", whose other ranks announced ", slot_it->second));
    }
    p.integrity = StrongerIntegrity(p.integrity, req.integrity());
    p.joined[req.rank()] = {req.node(), std::move(done)};
    p.bytes += bytes;
    pending_bytes_ += bytes;
    job_bytes_[p.job] += bytes;
    if (static_cast<int>(p.joined.size()) < p.nranks) return absl::OkStatus();
    timer_->Cancel(p.timer);
    std::vector<v1::NodeInfo> nodes;  // by rank: every rank in [0, nranks) has joined
    nodes.reserve(p.joined.size());
    for (auto& [rank, j] : p.joined) {
      nodes.push_back(std::move(j.node));
      dones.push_back(std::move(j.done));
    }
    result = Layout(nodes);
    if (absl::Status s = CheckLayoutFits(*result, req.comm_id()); !s.ok()) result = s;
    if (result.ok()) {
      *result->mutable_cost_model() = cost_model_;
      // Handed only to the members, over the peer plane: their inter-node transfers carry it.
      result->set_data_secret(RandomNonZero64());
      result->set_integrity(p.integrity);
    }
    RememberFormed(req.comm_id(), p.job);  // formed or refused: still this job's id
    ErasePendingLocked(it);
  }
  for (auto& d : dones) d(result);
  return absl::OkStatus();
}

void CommBootstrap::ErasePendingLocked(std::map<std::string, Pending>::iterator it) {
  const Pending& p = it->second;
  pending_bytes_ -= p.bytes;
  if (auto b = job_bytes_.find(p.job); b != job_bytes_.end() && (b->second -= p.bytes) == 0) {
    job_bytes_.erase(b);
  }
  job_pending_.Give(p.job);
  pending_.erase(it);
}

size_t CommBootstrap::pending_of(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  return job_pending_.of(job);
}

void CommBootstrap::Pending::TakeDones(std::vector<Done>* out) {
  for (auto& [rank, j] : joined) {
    if (j.done) out->push_back(std::move(j.done));
  }
}

void CommBootstrap::Shutdown(const absl::Status& status) {
  std::vector<Done> dones;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = status;
    for (auto& [comm_id, p] : pending_) {
      timer_->Cancel(p.timer);
      p.TakeDones(&dones);
    }
    while (!pending_.empty()) ErasePendingLocked(pending_.begin());
  }
  for (auto& d : dones) d(status);
}

void CommBootstrap::OnDeadline(const std::string& comm_id, uint64_t generation) {
  std::vector<Done> dones;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(comm_id);
    if (it == pending_.end() || it->second.generation != generation) return;
    // The first kListed missing ranks by number, then how many more (a bounded message).
    constexpr size_t kListed = 16;
    const Pending& p = it->second;
    const int missing = p.nranks - static_cast<int>(p.joined.size());
    std::vector<int> listed;
    for (int r = 0; r < p.nranks && listed.size() < kListed; ++r) {
      if (p.joined.count(r) == 0) listed.push_back(r);
    }
    const int more = missing - static_cast<int>(listed.size());
    status = absl::DeadlineExceededError(absl::StrCat(
        "communicator ", comm_id, ": rank", missing > 1 ? "s " : " ", absl::StrJoin(listed, ", "),
        more > 0 ? absl::StrCat(" and ", more, " more") : "", " of ", p.nranks,
        " did not join in time"));
    it->second.TakeDones(&dones);
    ErasePendingLocked(it);
  }
  for (auto& d : dones) d(status);
}

}  // namespace railyard
