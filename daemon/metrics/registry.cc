#include "daemon/metrics/registry.h"

#include <algorithm>
#include <cmath>

namespace railyard::metrics {
namespace internal {

size_t ThisThreadShard() {
  static std::atomic<size_t> next{0};
  thread_local const size_t shard = next.fetch_add(1, std::memory_order_relaxed) % kShards;
  return shard;
}

}  // namespace internal

double Counter::Value() const {
  double sum = 0;
  for (const auto& c : cells_) sum += c.value.load(std::memory_order_relaxed);
  return sum;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), shards_(new Shard[internal::kShards]) {
  for (size_t i = 0; i < internal::kShards; ++i) {
    shards_[i].counts = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  }
}

void Histogram::Observe(double v) {
  // Bucket i counts v <= bounds_[i] (and > bounds_[i-1]); the last one is +Inf. NaN lands there.
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  Shard& s = shards_[internal::ThisThreadShard()];
  s.counts[i].fetch_add(1, std::memory_order_relaxed);
  s.sum.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot snap;
  snap.bounds = bounds_;
  std::vector<uint64_t> per_bucket(bounds_.size() + 1, 0);
  for (size_t s = 0; s < internal::kShards; ++s) {
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      per_bucket[i] += shards_[s].counts[i].load(std::memory_order_relaxed);
    }
    snap.sum += shards_[s].sum.load(std::memory_order_relaxed);
  }
  uint64_t running = 0;
  for (uint64_t c : per_bucket) {
    running += c;
    snap.cumulative.push_back(running);
  }
  snap.count = running;
  return snap;
}

std::vector<double> Histogram::ExponentialBuckets(double start, double factor, int n) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < n; ++i, v *= factor) b.push_back(v);
  return b;
}

template <typename T>
Family<T>& Registry::AddFamily(const std::string& name, const std::string& help, MetricType type,
                               std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end()) {
    it = families_.emplace(name, std::make_unique<Family<T>>(name, help, type, std::move(bounds)))
             .first;
  }
  // A name reused with another type is a programming error; the first registration wins and
  // the second caller still gets a family of its own type (unexported) rather than a bad cast.
  if (it->second->type() == type) return *static_cast<Family<T>*>(it->second.get());
  static auto* orphan = new Family<T>(name, help, type);
  return *orphan;
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help) {
  return AddFamily<Counter>(name, help, MetricType::kCounter, {});
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help) {
  return AddFamily<Gauge>(name, help, MetricType::kGauge, {});
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<double> bounds) {
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  bounds.erase(
      std::remove_if(bounds.begin(), bounds.end(), [](double b) { return !std::isfinite(b); }),
      bounds.end());
  return AddFamily<Histogram>(name, help, MetricType::kHistogram, std::move(bounds));
}

void Registry::AddCollectHook(std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  hooks_.push_back(std::move(hook));
}

std::vector<const FamilyBase*> Registry::Collect() const {
  std::vector<std::function<void()>> hooks;
  {
    absl::MutexLock lock(&mu_);
    hooks = hooks_;
  }
  {
    absl::MutexLock lock(&scrape_mu_);
    for (const auto& h : hooks) h();
  }
  absl::MutexLock lock(&mu_);
  std::vector<const FamilyBase*> out;
  out.reserve(families_.size());
  for (const auto& [name, f] : families_) out.push_back(f.get());
  return out;
}

}  // namespace railyard::metrics
