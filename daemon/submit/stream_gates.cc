#include "daemon/submit/stream_gates.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/util/thread_name.h"
#include "proto/railyard/v1/spin_yield.h"

namespace railyard {

namespace {
constexpr absl::Duration kFirstSleep = absl::Microseconds(20);
// While nothing opens, the poller sleeps up to this long, and at most this fraction of the time
// since something last went: a gate that opens late waits at most ~1.6 % longer than it had.
constexpr absl::Duration kLongestIdleSleep = absl::Milliseconds(10);
constexpr int64_t kIdleSleepDivisor = 64;

// One less of `key` in counts, erasing it at zero.
template <typename K>
void Decrement(std::map<K, size_t>& counts, const K& key, size_t n) {
  auto it = counts.find(key);
  if (it == counts.end()) return;
  it->second -= std::min(n, it->second);
  if (it->second == 0) counts.erase(it);
}

absl::Status Expired(const StreamSync& gate) {
  const uint32_t now = gate.ready_word();
  return absl::DeadlineExceededError(
      absl::StrCat("the stream did not reach the operation within its timeout: the ready word (",
                   gate.Where(), ") holds ", now, ", the operation waits for ", gate.value,
                   " (is the stream stalled, or was the value not written?)"));
}
}  // namespace

StreamGates::StreamGates(absl::Duration spin, absl::Duration longest_sleep, Limits limits)
    : spin_(spin), longest_sleep_(longest_sleep), limits_(limits) {
  thread_ = std::thread([this] {
    NameDataPlaneThread("ry-stream-gates");
    Loop();
  });
}

StreamGates::~StreamGates() { Stop(); }

void StreamGates::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  thread_.join();
  std::vector<Item> left;
  {
    // A release handed to another thread still calls Finish on this object.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](StreamGates* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu_) { return g->releasing_ == 0; },
        this));
    for (auto& [key, q] : queues_) {
      for (Item& it : q.items) left.push_back(std::move(it));
    }
    queues_.clear();
    queue_count_.store(0, std::memory_order_release);
    held_ = 0;
    held_by_session_.clear();
    held_by_job_.clear();
  }
  for (Item& it : left) it.fail(absl::UnavailableError("railyardd is shutting down"));
}

bool StreamGates::MustHold(const Key& key, const std::optional<StreamSync>& gate) const {
  // Every submission asks: with nothing held anywhere (the usual case), no lock is taken.
  if (queue_count_.load(std::memory_order_acquire) > 0) {
    absl::MutexLock lock(&mu_);
    if (queues_.count(key) != 0) return true;
  }
  return gate.has_value() && !gate->ready();
}

absl::Status StreamGates::Hold(const Key& key, const std::string& job, Item item) {
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("railyardd is shutting down");
  auto queue = queues_.find(key);
  const size_t in_queue = queue == queues_.end() ? 0 : queue->second.items.size();
  const auto count_of = [](const auto& counts, const auto& k) -> size_t {
    auto it = counts.find(k);
    return it == counts.end() ? 0 : it->second;
  };
  std::string full;
  if (in_queue >= limits_.per_queue) {
    full = absl::StrCat(in_queue,
                        " operations of this rank on this communicator already wait for "
                        "their streams to reach them, the most one rank may hold");
  } else if (const size_t n = count_of(held_by_session_, key.owner); n >= limits_.per_session) {
    full = absl::StrCat(n,
                        " operations of this session already wait for their streams, its "
                        "limit (--max_held_ops_per_session)");
  } else if (const size_t j = count_of(held_by_job_, job); j >= limits_.per_job) {
    full = absl::StrCat(j, " operations of job ", job,
                        " already wait for their streams, its "
                        "limit (--max_held_ops_per_job)");
  } else if (held_ >= limits_.total) {
    full = absl::StrCat(held_,
                        " operations already wait for their streams on this daemon, "
                        "its limit");
  }
  if (!full.empty()) return absl::ResourceExhaustedError(full);
  auto [it, made] = queues_.try_emplace(key);
  if (made) {
    queue_count_.fetch_add(1, std::memory_order_acq_rel);
    it->second.job = job;
  }
  Queue& q = it->second;
  q.items.push_back(std::move(item));
  ++held_;
  ++held_by_session_[key.owner];
  ++held_by_job_[q.job];
  wake_ = true;
  return absl::OkStatus();
}

std::map<StreamGates::Key, StreamGates::Queue>::iterator StreamGates::TakeLocked(
    std::map<Key, Queue>::iterator it, std::vector<Item>* taken) {
  Queue& q = it->second;
  // A busy front item is the poller's; it pops it when done.
  const size_t keep = q.busy ? 1 : 0;
  for (size_t i = keep; i < q.items.size(); ++i) taken->push_back(std::move(q.items[i]));
  ForgetLocked(it->first, q, q.items.size() - keep);
  q.items.resize(keep);
  return q.items.empty() ? EraseLocked(it) : std::next(it);
}

std::map<StreamGates::Key, StreamGates::Queue>::iterator StreamGates::EraseLocked(
    std::map<Key, Queue>::iterator it) {
  queue_count_.fetch_sub(1, std::memory_order_acq_rel);
  return queues_.erase(it);
}

void StreamGates::Drop(const void* owner, const absl::Status& why) {
  std::vector<Item> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = queues_.lower_bound(Key{owner, 0});
         it != queues_.end() && it->first.owner == owner;) {
      it = TakeLocked(it, &dropped);
    }
  }
  for (Item& it : dropped) it.fail(why);  // in the order they were held
}

void StreamGates::Drop(const Key& key, const absl::Status& why) {
  std::vector<Item> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = queues_.find(key); it != queues_.end()) TakeLocked(it, &dropped);
  }
  for (Item& it : dropped) it.fail(why);
}

void StreamGates::Finish(const Key& key) {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(key);
  if (it == queues_.end() || !it->second.busy) return;
  it->second.items.pop_front();
  it->second.busy = false;
  ForgetLocked(key, it->second, 1);
  if (it->second.items.empty()) EraseLocked(it);
  wake_ = true;  // its next item may be ready already
}

void StreamGates::ForgetLocked(const Key& key, const Queue& q, size_t n) {
  held_ -= n;
  Decrement(held_by_session_, key.owner, n);
  Decrement(held_by_job_, q.job, n);
}

size_t StreamGates::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

uint64_t StreamGates::polls() const {
  absl::MutexLock lock(&mu_);
  return polls_;
}

void StreamGates::Loop() {
  absl::Time last_progress = absl::Now();
  absl::Duration sleep = std::min(kFirstSleep, longest_sleep_);
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (held_ == 0) {
      // Idle: no CPU until something is held.
      mu_.Await(absl::Condition(
          +[](StreamGates* g)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu_) { return g->stop_ || g->held_ > 0; },
          this));
      wake_ = false;
      last_progress = absl::Now();
      sleep = std::min(kFirstSleep, longest_sleep_);
      continue;
    }
    ++polls_;
    wake_ = false;
    const absl::Time now = absl::Now();
    // Each queue's front: let it go when its gate is open (or it has none), fail it when its
    // deadline has passed. Callbacks run unlocked; the queue stays busy (and in order) meanwhile.
    struct Due {
      Key key;
      Item item;
      absl::Status failed;
    };
    std::vector<Due> due;
    for (auto& [key, q] : queues_) {
      if (q.busy || q.items.empty()) continue;
      Item& front = q.items.front();
      const bool open = !front.gate.has_value() || front.gate->ready();
      if (!open && now < front.deadline) continue;
      q.busy = true;
      absl::Status failed = open ? absl::OkStatus() : Expired(*front.gate);
      due.push_back({key, std::move(front), std::move(failed)});
    }
    if (due.empty()) {
      if (now - last_progress < spin_) {
        mu_.Unlock();
        const bool yielded = ringproto::SpinYield();
        mu_.Lock();
        if (yielded) continue;  // else the core is contended: sleep as after the spin
      }
      mu_.AwaitWithTimeout(absl::Condition(&wake_), sleep);
      const absl::Duration idle =
          std::min(kLongestIdleSleep, (now - last_progress) / kIdleSleepDivisor);
      sleep = std::min(sleep * 2, std::max(longest_sleep_, idle));
      continue;
    }
    for (const Due& d : due) releasing_ += d.failed.ok() ? 1 : 0;
    mu_.Unlock();
    for (Due& d : due) {
      if (d.failed.ok()) {
        auto called = std::make_shared<std::atomic<bool>>(false);
        d.item.release([this, key = d.key, called] {
          if (called->exchange(true)) return;  // once
          Finish(key);
          absl::MutexLock lock(&mu_);
          --releasing_;
        });
      } else {
        d.item.fail(d.failed);
        Finish(d.key);
      }
      d.item = Item();  // what the callbacks hold goes before the next is let go
    }
    mu_.Lock();
    last_progress = absl::Now();
    sleep = std::min(kFirstSleep, longest_sleep_);
  }
}

}  // namespace railyard
