// A small metrics registry shaped like prometheus-cpp's (prometheus-cpp is not packaged for
// Debian 12): families of counters, gauges and histograms, one child per label set, rendered in
// the Prometheus text format by daemon/metrics/exposition.h.
//
// Updates are on the data path (a chunk sent, a collective done), so they take no lock: a
// counter or histogram is split into cache-line shards picked by the updating thread, each a
// relaxed atomic; a scrape adds the shards up. Creating a child (Family::Add) takes the family's
// lock: callers do it once per label set and keep the reference, which stays valid until the
// child is removed (Family::RemoveWhere, for series of things that are gone: a job) or, for a
// holder that may outlive that, as long as it keeps the shared_ptr of Family::Hold.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace railyard::metrics {

// Label name -> value. Ordered, so children and their rendering are deterministic.
using Labels = std::map<std::string, std::string>;

namespace internal {
inline constexpr size_t kShards = 16;
// The shard of the calling thread: threads are spread over the shards round-robin.
size_t ThisThreadShard();
struct alignas(64) DoubleCell {
  std::atomic<double> value{0.0};
};
}  // namespace internal

// A monotonically increasing value (bytes, operations, seconds).
class Counter {
 public:
  // Adds v (ignored unless v >= 0: a counter never goes down).
  void Increment(double v = 1.0) {
    if (!(v >= 0)) return;
    cells_[internal::ThisThreadShard()].value.fetch_add(v, std::memory_order_relaxed);
  }
  double Value() const;

 private:
  internal::DoubleCell cells_[internal::kShards];
};

// A value that goes up and down (sessions, bytes registered, a rate).
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Increment(double v = 1.0) { value_.fetch_add(v, std::memory_order_relaxed); }
  void Decrement(double v = 1.0) { value_.fetch_sub(v, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted in buckets with fixed upper bounds, plus their sum and count.
class Histogram {
 public:
  // bounds: strictly increasing, finite upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Collect() const;

  // bounds start, start*factor, ... (n of them).
  static std::vector<double> ExponentialBuckets(double start, double factor, int n);

 private:
  struct alignas(64) Shard {
    std::unique_ptr<std::atomic<uint64_t>[]> counts;  // per bound, then +Inf
    std::atomic<double> sum{0.0};
  };
  const std::vector<double> bounds_;
  std::unique_ptr<Shard[]> shards_;
};

enum class MetricType { kCounter, kGauge, kHistogram };

// What exposition needs of any family, whatever its type.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, MetricType type)
      : name_(std::move(name)), help_(std::move(help)), type_(type) {}
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }

  // One child's value(s) at scrape time.
  struct Sample {
    Labels labels;
    double value = 0;               // counter, gauge
    Histogram::Snapshot histogram;  // histogram
  };
  virtual std::vector<Sample> Collect() const = 0;

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
};

template <typename T>
class Family : public FamilyBase {
 public:
  Family(std::string name, std::string help, MetricType type, std::vector<double> bounds = {})
      : FamilyBase(std::move(name), std::move(help), type), bounds_(std::move(bounds)) {}

  // The child with these labels, created on first use. The reference lives as long as the
  // registry unless the child is removed (RemoveWhere).
  T& Add(const Labels& labels) { return *Hold(labels); }
  // The same child, shared: it stays valid for the holder after it is removed from the family
  // (it is then no longer exported; a later Add makes a new one, starting at zero).
  std::shared_ptr<T> Hold(const Labels& labels) {
    absl::MutexLock lock(&mu_);
    auto it = children_.find(labels);
    if (it == children_.end()) it = children_.emplace(labels, Make()).first;
    return it->second;
  }
  // Removes every child whose label `name` is `value` (the series of a job that is gone: it
  // vanishes from the exposition, which Prometheus reads as the series ending). Returns how many.
  // References from Add to them become invalid; Hold's stay valid.
  size_t RemoveWhere(const std::string& name, const std::string& value) {
    absl::MutexLock lock(&mu_);
    size_t n = 0;
    for (auto it = children_.begin(); it != children_.end();) {
      auto label = it->first.find(name);
      if (label != it->first.end() && label->second == value) {
        it = children_.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }
  // True when a child other than the family itself holds it (Hold's shared_ptr is still kept).
  bool HeldElsewhere(const Labels& labels) const {
    absl::MutexLock lock(&mu_);
    auto it = children_.find(labels);
    return it != children_.end() && it->second.use_count() > 1;
  }
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return children_.size();
  }

  std::vector<Sample> Collect() const override {
    absl::MutexLock lock(&mu_);
    std::vector<Sample> out;
    out.reserve(children_.size());
    for (const auto& [labels, child] : children_) {
      Sample s;
      s.labels = labels;
      if constexpr (std::is_same_v<T, Histogram>) {
        s.histogram = child->Collect();
      } else {
        s.value = child->Value();
      }
      out.push_back(std::move(s));
    }
    return out;
  }

 private:
  std::shared_ptr<T> Make() const {
    if constexpr (std::is_same_v<T, Histogram>) {
      return std::make_shared<Histogram>(bounds_);
    } else {
      return std::make_shared<T>();
    }
  }

  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::map<Labels, std::shared_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  // Registering a name twice returns the first family (its help and buckets win). Names and
  // label names must match [a-zA-Z_:][a-zA-Z0-9_:]* (checked by exposition tests, not here).
  Family<Counter>& AddCounter(const std::string& name, const std::string& help);
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help);
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> bounds);

  // Runs before every scrape, to refresh values derived from state (gauges of sessions, CPU
  // time, rates). Hooks run in registration order, one scrape at a time.
  void AddCollectHook(std::function<void()> hook);

  // Runs the hooks, then returns the families sorted by name.
  std::vector<const FamilyBase*> Collect() const;

 private:
  template <typename T>
  Family<T>& AddFamily(const std::string& name, const std::string& help, MetricType type,
                       std::vector<double> bounds);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> hooks_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex scrape_mu_;  // one scrape (and its hooks) at a time
};

}  // namespace railyard::metrics
