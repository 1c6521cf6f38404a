// The rebuild of a client's session on the next railyardd, after a handover or a crash
// (docs/restarts.md): what the old daemon took, a new session, buffers and communicators again,
// and what goes out again in order.
#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client_core.h"
#include "client_link.h"

namespace railyard {

void ClientCore::RebuildLoop(std::chrono::steady_clock::time_point deadline) {
  while (true) {
    std::shared_ptr<Link> old;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_ || dead_) return;
      old = link_;
    }
    const Rebuilt rebuilt = RebuildOnce(old, deadline);
    if (rebuilt == Rebuilt::kGaveUp) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_ || dead_ || state_ == State::kLive) return;
    // The new session ended already, or its daemon went away while it was being rebuilt: once
    // more, within the same window.
  }
}

ClientCore::Rebuilt ClientCore::RebuildOnce(const std::shared_ptr<Link>& old,
                                            std::chrono::steady_clock::time_point deadline) {
  if (old->reader.joinable() && old->reader.get_id() != std::this_thread::get_id()) {
    old->reader.join();
  }
  // 1. What the old daemon took of the rings: its head. Nothing is published on them after this.
  uint64_t head = 0;
  if (old->rings != nullptr) {
    old->rings->Drain();
    old->rings->Close();
    old->rings->FenceSubmissions();
    head = old->rings->ConsumedHead();
  }
  const bool handover = old->moving;
  std::vector<std::pair<std::shared_ptr<internal::PendingRequest>, absl::Status>> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<uint64_t, std::vector<uint64_t>> taken;  // by comm: collectives the daemon took
    for (auto it = pending_.begin(); it != pending_.end();) {
      Outstanding& o = it->second;
      const uint64_t slot = o.pending->sq_first.load();
      // On the rings only what the daemon's head passed was taken; over gRPC what was sent.
      const bool was_taken =
          !o.unsent && !o.moved &&
          (o.via_rings ? slot != internal::PendingRequest::kUnpublished && slot < head : true);
      if (!was_taken) {
        o.unsent = true;  // never taken, or handed back: the next daemon runs it
        o.moved = false;
        ++it;
        continue;
      }
      if (internal::IsCollective(o.request)) {
        taken[o.request.comm_handle()].push_back(it->first);
        ++it;
        continue;
      }
      // A send or receive the daemon had taken may have moved its bytes: not run twice.
      failed.emplace_back(o.pending,
                          RestartedStatus(o.request,
                                          "a send or receive is not run twice, its peer's "
                                          "matching operation fails too or times out"));
      it = pending_.erase(it);
    }
    for (auto& [comm, ids] : taken) {
      bool safe = true;
      for (uint64_t id : ids) safe = safe && pending_.at(id).pending->rerun_safe;
      if (safe) {
        for (uint64_t id : ids) pending_.at(id).unsent = true;  // run again from its inputs
        continue;
      }
      for (uint64_t id : ids) {
        Outstanding& o = pending_.at(id);
        failed.emplace_back(o.pending,
                            RestartedStatus(o.request,
                                            "running it again is not safe: its output may have "
                                            "overwritten its input"));
        pending_.erase(id);
      }
      // They took their sequence numbers with them: kept on the communicator, so that a second
      // attempt within the window (a new daemon that died too) rejoins from the same number.
      if (auto c = comms_.find(comm); c != comms_.end()) c->second.next_seq += ids.size();
    }
  }
  for (auto& [p, st] : failed) p->Complete(st, 0);
  failed.clear();

  // 2. A session with the daemon at the socket now (a new one, or the same one back).
  std::shared_ptr<Link> link;
  absl::Status last = absl::UnavailableError("no attempt");
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_) return Rebuilt::kGaveUp;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    const auto attempt = std::min<std::chrono::milliseconds>(
        internal::kReconnectAttempt,
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    absl::StatusOr<std::shared_ptr<Link>> made = OpenLink(attempt);
    if (made.ok()) {
      link = *std::move(made);
      break;
    }
    last = made.status();
    if (last.code() == absl::StatusCode::kPermissionDenied ||
        last.code() == absl::StatusCode::kInvalidArgument ||
        last.code() == absl::StatusCode::kUnauthenticated) {
      break;  // the daemon refuses this session: waiting will not change that
    }
    std::this_thread::sleep_for(internal::kReconnectPause);
  }
  if (link == nullptr) {
    Die(absl::UnavailableError(
        absl::StrCat("railyardd at ", socket_, handover ? " handed the node over" : " went away",
                     " and no daemon took this session back in time ($RAILYARD_RECONNECT_S): ",
                     last.message())));
    return Rebuilt::kGaveUp;
  }

  // 3. Buffers again, in the order they were registered (a part after its parent).
  std::vector<std::pair<uint64_t, v1::RegisterBufferRequest>> regs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [vid, b] : buffers_) {
      v1::RegisterBufferRequest r;
      r.set_size_bytes(b.size);
      if (b.parent != 0) {
        r.set_parent_buffer_id(b.parent);  // translated below
        r.set_parent_offset(b.parent_offset);
      } else if (!b.ipc_handle.empty()) {
        r.set_memory(v1::MEMORY_KIND_CUDA);
        r.set_device(b.device);
        r.set_cuda_ipc_handle(b.ipc_handle);
        r.set_cuda_ipc_offset(b.ipc_offset);
      } else if (b.device >= 0) {
        r.set_memory(v1::MEMORY_KIND_CUDA);
        r.set_device(b.device);
      }
      regs.emplace_back(vid, std::move(r));
    }
  }
  std::map<uint64_t, uint64_t> new_ids;
  for (auto& [vid, r] : regs) {
    if (r.parent_buffer_id() != 0) r.set_parent_buffer_id(new_ids[r.parent_buffer_id()]);
    if (r.parent_buffer_id() == 0 && r.cuda_ipc_handle().empty()) {
      int fd = -1;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto b = buffers_.find(vid);
        if (b == buffers_.end()) continue;                     // released meanwhile
        fd = ::fcntl(b->second.fd.get(), F_DUPFD_CLOEXEC, 0);  // ours while it is sent
      }
      internal::OwnedFd sending(fd);
      absl::StatusOr<uint64_t> handle = link->fd_channel->Put(fd, internal::kRpcTimeout);
      if (!handle.ok()) {
        if (GoneAgain(*link, handle.status(), deadline)) return Rebuilt::kAgain;
        Die(absl::Status(handle.status().code(),
                         absl::StrCat("reconnecting: buffer ", vid,
                                      " could not be passed again: ", handle.status().message())));
        return Rebuilt::kGaveUp;
      }
      r.set_fd_handle(*handle);
    }
    absl::StatusOr<uint64_t> id = RegisterOn(*link, r);
    if (!id.ok()) {
      if (GoneAgain(*link, id.status(), deadline)) return Rebuilt::kAgain;
      Die(absl::Status(id.status().code(),
                       absl::StrCat("reconnecting: buffer ", vid,
                                    " could not be registered again: ", id.status().message())));
      return Rebuilt::kGaveUp;
    }
    new_ids[vid] = *id;
  }

  // 4. Communicators again, all at once (every rank of each rejoins; an order could deadlock).
  struct Rejoin {
    uint64_t vid = 0;
    std::string comm_id;
    int rank = 0, nranks = 0;
    uint64_t resume_seq = 0;
    absl::StatusOr<v1::InitCommResponse> result = absl::UnknownError("not run");
  };
  std::vector<Rejoin> rejoins;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [vid, c] : comms_) {
      if (!c.broken.ok()) continue;
      if (c.nnodes > 1) {
        // Its other daemons do not pause it while this one restarts (not yet): it failed there.
        c.broken = absl::UnavailableError(absl::StrCat(
            "communicator ", c.comm_id, " spans ", c.nnodes,
            " nodes, and communicators spanning nodes are not carried across a restart of one "
            "of their daemons yet (docs/restarts.md): create it again"));
        continue;
      }
      rejoins.push_back({vid, c.comm_id, c.rank, c.nranks, c.next_seq});
    }
  }
  {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::max(deadline - std::chrono::steady_clock::now(),
                 std::chrono::steady_clock::duration(std::chrono::seconds(5))));
    std::vector<std::thread> threads;
    for (Rejoin& r : rejoins) {
      threads.emplace_back([&, rp = &r] {
        rp->result = InitCommOn(*link, rp->comm_id, rp->rank, rp->nranks, left, rp->resume_seq);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (const Rejoin& r : rejoins) {
    // A rejoin cut short by the new daemon's end is no verdict on the communicator.
    if (!r.result.ok() && GoneAgain(*link, r.result.status(), deadline)) return Rebuilt::kAgain;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [vid, id] : new_ids) {
      if (auto b = buffers_.find(vid); b != buffers_.end())
        b->second.id = id;  // (released meanwhile)
    }
    for (Rejoin& r : rejoins) {
      auto found = comms_.find(r.vid);
      if (found == comms_.end()) continue;  // destroyed meanwhile
      CommRecord& c = found->second;
      if (!r.result.ok()) {
        c.broken =
            absl::Status(r.result.status().code(), absl::StrCat("communicator ", c.comm_id,
                                                                " could not be joined "
                                                                "again after railyardd restarted: ",
                                                                r.result.status().message()));
        continue;
      }
      c.handle = r.result->comm_handle();
      const uint64_t first = r.result->first_seq();
      uint64_t lost = first > r.resume_seq ? first - r.resume_seq : 0;
      c.next_seq = first;
      // Another rank's copy of the collectives in between failed in the restart: so do ours,
      // those held here now and, for the rest, the next ones submitted.
      for (auto it = pending_.begin(); lost > 0 && it != pending_.end();) {
        Outstanding& o = it->second;
        if (o.unsent && o.request.comm_handle() == r.vid && internal::IsCollective(o.request)) {
          failed.emplace_back(o.pending, LostStatus(o.request, c.comm_id));
          it = pending_.erase(it);
          --lost;
          continue;
        }
        ++it;
      }
      c.lost = lost;
    }
    // Operations on a communicator that is gone fail with why.
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto c = comms_.find(it->second.request.comm_handle());
      if (it->second.unsent && c != comms_.end() && !c->second.broken.ok()) {
        failed.emplace_back(it->second.pending, c->second.broken);
        it = pending_.erase(it);
        continue;
      }
      ++it;
    }
    link_ = link;
    ++generation_;
    translating_.store(true);
    session_id_ = link->session_id;
    node_name_ = link->node_name;
  }
  cv_.notify_all();
  for (auto& [p, st] : failed) p->Complete(st, 0);
  // 5. What was not taken, handed back, or is safe to run again: in the order it was submitted.
  SendUnsent();
  return Rebuilt::kDone;
}

bool ClientCore::GoneAgain(Link& link, const absl::Status& status,
                           std::chrono::steady_clock::time_point deadline) {
  if (status.code() != absl::StatusCode::kUnavailable &&
      status.code() != absl::StatusCode::kCancelled) {
    return false;
  }
  if (std::chrono::steady_clock::now() >= deadline) return false;
  std::unique_lock<std::mutex> lock(mu_);
  // Its stream ends within moments of its daemon's end: wait for that, briefly.
  cv_.wait_for(lock, std::chrono::seconds(2), [&] { return link.ended || shutting_down_; });
  return link.ended && !shutting_down_;
}

absl::Status ClientCore::RestartedStatus(const v1::SubmitRequest& request, const char* why) const {
  return absl::UnavailableError(absl::StrCat(
      "railyardd at ", socket_, " restarted during this ", v1::CollectiveOp_Name(request.op()),
      " (it had taken it; ", why, "); the communicator goes on"));
}

absl::Status ClientCore::LostStatus(const v1::SubmitRequest& request, const std::string& comm_id) {
  return absl::UnavailableError(
      absl::StrCat("railyardd restarted during this ", v1::CollectiveOp_Name(request.op()),
                   " on another rank of communicator ", comm_id,
                   ", which could not run it again; the communicator goes on"));
}

void ClientCore::SendUnsent() {
  while (true) {
    std::vector<uint64_t> ids;
    std::shared_ptr<Link> link;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_ || dead_ || link_->ended) return;
      for (auto& [id, o] : pending_) {
        if (o.unsent) ids.push_back(id);
      }
      if (ids.empty()) {
        // Under the lock that found nothing held: what is submitted from now on goes straight.
        state_ = State::kLive;
        cv_.notify_all();
        return;
      }
      link = link_;
    }
    SendOn(link, ids, false);
  }
}

}  // namespace railyard
