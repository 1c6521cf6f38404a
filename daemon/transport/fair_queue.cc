#include "daemon/transport/fair_queue.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/time/time.h"
#include "daemon/util/thread_name.h"

namespace railyard::transport {
namespace {

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Deficit round robin over the keys of `active` (one level: jobs, or one job's communicators):
// the node whose head goes next. A node starting its turn gains quantum * weight; it keeps the
// turn while its deficit covers its head. When a whole round serves nobody (heads larger than
// a quantum), the rounds until the first node can send are granted at once, so a rare large
// message costs one pass, not bytes / quantum of them.
template <typename Node, typename HeadFn, typename WeightFn>
Node& DrrSelect(std::list<std::string>& active, std::map<std::string, Node>& nodes, double quantum,
                HeadFn head, WeightFn weight) {
  size_t unserved = 0;
  for (;;) {
    const std::string& key = active.front();
    Node& n = nodes.at(key);
    if (!n.in_turn) {
      n.deficit += quantum * weight(key);
      n.in_turn = true;
    }
    if (static_cast<double>(head(n)) <= n.deficit) return n;
    n.in_turn = false;
    active.splice(active.end(), active, active.begin());
    if (++unserved < active.size()) continue;
    double rounds = std::numeric_limits<double>::infinity();
    for (const std::string& k : active) {
      Node& x = nodes.at(k);
      rounds = std::min(
          rounds, std::ceil((static_cast<double>(head(x)) - x.deficit) / (quantum * weight(k))));
    }
    if (rounds > 1) {
      for (const std::string& k : active) nodes.at(k).deficit += (rounds - 1) * quantum * weight(k);
    }
    unserved = 0;
  }
}

}  // namespace

FairSchedule::FairSchedule(Options options) : options_(std::move(options)) {
  if (!(options_.rate_bytes_per_s > 0)) options_.rate_bytes_per_s = 1;
  if (!(options_.quantum_bytes > 0)) options_.quantum_bytes = 64 * 1024;
  double burst = options_.burst_bytes;
  if (!(burst > 0)) burst = std::max(64.0 * 1024, options_.rate_bytes_per_s * 1e-3);
  burst_ns_ = burst / options_.rate_bytes_per_s * 1e9;
  if (!(options_.express_bytes > 0)) options_.express_bytes = 0;
  express_cap_ = 4 * options_.express_bytes;
  window_ns_ = std::max<int64_t>(10'000'000, static_cast<int64_t>(4 * burst_ns_));
}

FairSchedule::Recent& FairSchedule::RefreshCredit(const std::string& job, int64_t now_ns) {
  for (auto it = recent_.begin(); it != recent_.end();) {
    if (it->first != job && it->second.last_ns < now_ns - window_ns_ &&
        jobs_.find(it->first) == jobs_.end()) {
      it = recent_.erase(it);
    } else {
      ++it;
    }
  }
  auto [it, fresh] = recent_.try_emplace(job);
  Recent& r = it->second;
  if (fresh) {
    r.credit = express_cap_;
    r.credit_ns = now_ns;
  }
  if (now_ns > r.credit_ns) {
    double total = 0;
    for (const auto& [name, other] : recent_) total += Weight(name);
    const double share = total > 0 ? Weight(job) / total : 1;
    r.credit = std::min(express_cap_, r.credit + static_cast<double>(now_ns - r.credit_ns) * 1e-9 *
                                                     options_.rate_bytes_per_s * share);
    r.credit_ns = now_ns;
  }
  r.last_ns = std::max(r.last_ns, now_ns);
  return r;
}

void FairSchedule::Spend(const std::string& job, size_t bytes, int64_t now_ns) {
  if (express_cap_ <= 0) return;
  Recent& r = RefreshCredit(job, now_ns);
  r.credit = std::max(-express_cap_, r.credit - static_cast<double>(bytes));
}

bool FairSchedule::TrySendNow(const std::string& job, size_t bytes, int64_t now_ns) {
  if (queued_items_ == 0 && CanSendNow(now_ns)) {
    Sent(bytes, now_ns);
    Spend(job, bytes, now_ns);
    return true;
  }
  if (express_cap_ <= 0 || static_cast<double>(bytes) > options_.express_bytes ||
      jobs_.find(job) != jobs_.end()) {
    if (express_cap_ > 0) RefreshCredit(job, now_ns);  // it is active: it holds a share
    return false;
  }
  Recent& r = RefreshCredit(job, now_ns);
  if (r.credit < static_cast<double>(bytes)) return false;
  r.credit -= static_cast<double>(bytes);
  Sent(bytes, now_ns);
  ++express_sends_;
  return true;
}

double FairSchedule::Weight(const std::string& job) const {
  if (!options_.weight) return 1;
  const double w = options_.weight(job);
  return w > 0 && std::isfinite(w) ? w : 1;
}

void FairSchedule::Enqueue(Item item) {
  ++queued_items_;
  queued_bytes_ += item.bytes;
  auto [jit, new_job] = jobs_.try_emplace(item.job);
  Job& j = jit->second;
  if (new_job || j.active.empty()) active_.push_back(item.job);
  auto [cit, new_comm] = j.comms.try_emplace(item.comm);
  if (new_comm || cit->second.items.empty()) j.active.push_back(item.comm);
  cit->second.items.push_back(std::move(item));
}

bool FairSchedule::CanSendNow(int64_t now_ns) const {
  return link_free_ns_ <= static_cast<double>(now_ns) + burst_ns_;
}

void FairSchedule::Sent(size_t bytes, int64_t now_ns) {
  link_free_ns_ = std::max(link_free_ns_, static_cast<double>(now_ns)) +
                  static_cast<double>(bytes) / options_.rate_bytes_per_s * 1e9;
}

FairSchedule::Comm& FairSchedule::SelectComm(Job& j) {
  return DrrSelect(
      j.active, j.comms, options_.quantum_bytes,
      [](const Comm& c) { return c.items.front().bytes; }, [](const std::string&) { return 1.0; });
}

FairSchedule::Item FairSchedule::PopJob(Job& j) {
  Comm& c = SelectComm(j);
  Item item = std::move(c.items.front());
  c.items.pop_front();
  c.deficit -= static_cast<double>(item.bytes);
  if (c.items.empty()) {
    j.comms.erase(j.active.front());
    j.active.pop_front();
  } else if (static_cast<double>(c.items.front().bytes) > c.deficit) {
    c.in_turn = false;
    j.active.splice(j.active.end(), j.active, j.active.begin());
  }
  return item;
}

bool FairSchedule::Next(int64_t now_ns, Item* out, int64_t* wake_ns) {
  if (queued_items_ == 0) {
    *wake_ns = 0;
    return false;
  }
  if (!CanSendNow(now_ns)) {
    *wake_ns = static_cast<int64_t>(std::ceil(link_free_ns_ - burst_ns_));
    return false;
  }
  Job& j = DrrSelect(
      active_, jobs_, options_.quantum_bytes,
      [this](Job& job) { return SelectComm(job).items.front().bytes; },
      [this](const std::string& job) {
        // A job's weight is read as it starts a turn; DrrSelect asks again while skipping rounds.
        Job& x = jobs_.at(job);
        if (!x.in_turn) x.weight = Weight(job);
        return x.weight;
      });
  *out = PopJob(j);
  j.deficit -= static_cast<double>(out->bytes);
  if (j.active.empty()) {
    jobs_.erase(active_.front());
    active_.pop_front();
  } else if (static_cast<double>(SelectComm(j).items.front().bytes) > j.deficit) {
    j.in_turn = false;
    active_.splice(active_.end(), active_, active_.begin());
  }
  --queued_items_;
  queued_bytes_ -= out->bytes;
  Sent(out->bytes, now_ns);
  Spend(out->job, out->bytes, now_ns);
  return true;
}

std::vector<FairSchedule::Item> FairSchedule::Drain(const std::string& job,
                                                    const std::string& comm) {
  std::vector<Item> out;
  auto jit = jobs_.find(job);
  if (jit == jobs_.end()) return out;
  Job& j = jit->second;
  auto cit = j.comms.find(comm);
  if (cit == j.comms.end()) return out;
  for (Item& item : cit->second.items) {
    --queued_items_;
    queued_bytes_ -= item.bytes;
    out.push_back(std::move(item));
  }
  j.comms.erase(cit);
  j.active.remove(comm);
  if (j.active.empty()) {
    jobs_.erase(jit);
    active_.remove(job);
  }
  return out;
}

std::vector<FairSchedule::Item> FairSchedule::DrainAll() {
  std::vector<Item> out;
  for (auto& [name, j] : jobs_) {
    for (auto& [comm, c] : j.comms) {
      for (Item& item : c.items) out.push_back(std::move(item));
    }
  }
  jobs_.clear();
  active_.clear();
  queued_items_ = 0;
  queued_bytes_ = 0;
  return out;
}

FairQueue::FairQueue(Options options)
    : options_(std::move(options)),
      rate_(options_.schedule.rate_bytes_per_s),
      schedule_(options_.schedule) {
  thread_ = std::thread([this] {
    NameDataPlaneThread("ry-rail-pacer");
    Run();
  });
}

FairQueue::~FairQueue() { Shutdown(); }

void FairQueue::Submit(const std::string& job, const std::string& comm, size_t bytes,
                       IssueFn issue) {
  {
    absl::MutexLock l(&mu_);
    const int64_t now = SteadyNowNs();
    if (!stop_ && !schedule_.TrySendNow(job, bytes, now)) {
      const uint64_t id = next_id_++;
      pending_.emplace(id, std::move(issue));
      schedule_.Enqueue({id, job, comm, bytes, now});
      return;
    }
  }
  if (options_.on_sent) options_.on_sent(job, bytes, 0);
  issue();
}

void FairQueue::IssueAll(std::vector<FairSchedule::Item> items) {
  std::vector<std::pair<FairSchedule::Item, IssueFn>> ready;
  {
    absl::MutexLock l(&mu_);
    for (FairSchedule::Item& item : items) {
      auto it = pending_.find(item.id);
      if (it == pending_.end()) continue;
      ready.emplace_back(std::move(item), std::move(it->second));
      pending_.erase(it);
    }
  }
  const int64_t now = SteadyNowNs();
  for (auto& [item, fn] : ready) {
    if (options_.on_sent) {
      options_.on_sent(item.job, item.bytes, static_cast<double>(now - item.enqueued_ns) * 1e-9);
    }
    fn();
  }
}

void FairQueue::Flush(const std::string& job, const std::string& comm) {
  std::vector<FairSchedule::Item> items;
  {
    absl::MutexLock l(&mu_);
    items = schedule_.Drain(job, comm);
  }
  IssueAll(std::move(items));
}

void FairQueue::Shutdown() {
  {
    absl::MutexLock l(&mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  std::vector<FairSchedule::Item> items;
  {
    absl::MutexLock l(&mu_);
    items = schedule_.DrainAll();
  }
  IssueAll(std::move(items));
}

size_t FairQueue::queued_items() const {
  absl::MutexLock l(&mu_);
  return schedule_.queued_items();
}

uint64_t FairQueue::queued_bytes() const {
  absl::MutexLock l(&mu_);
  return schedule_.queued_bytes();
}

void FairQueue::Run() {
  std::vector<std::pair<FairSchedule::Item, IssueFn>> batch;
  for (;;) {
    int64_t now = 0;
    {
      absl::MutexLock l(&mu_);
      // Idle: sleep until something is queued (no timeout: an idle rail costs no CPU).
      mu_.Await(absl::Condition(
          +[](FairQueue* q)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) { return q->stop_ || !q->schedule_.empty(); },
          this));
      if (stop_) return;
      now = SteadyNowNs();
      FairSchedule::Item item;
      int64_t wake = 0;
      while (schedule_.Next(now, &item, &wake)) {
        auto it = pending_.find(item.id);
        batch.emplace_back(std::move(item), std::move(it->second));
        pending_.erase(it);
      }
      if (batch.empty()) {
        // Backlogged, and the rate lets nothing out before wake: sleep until then (or stop).
        mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Nanoseconds(wake - now));
        continue;
      }
    }
    for (auto& [item, fn] : batch) {
      if (options_.on_sent) {
        options_.on_sent(item.job, item.bytes, static_cast<double>(now - item.enqueued_ns) * 1e-9);
      }
      fn();
    }
    batch.clear();
  }
}

}  // namespace railyard::transport
