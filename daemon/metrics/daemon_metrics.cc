#include "daemon/metrics/daemon_metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <initializer_list>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace railyard::metrics {
namespace {

// Weight of the newest operation in the bandwidth averages (about the last 10 operations).
constexpr double kEwmaAlpha = 0.2;
// Throughput gauges are rates over at least this window, refreshed by scrapes.
constexpr absl::Duration kRateWindow = absl::Seconds(1);

const Labels kNoLabels;

// A counter that mirrors a monotonic source read at each scrape: grows by what the source grew
// since the last scrape (*reported), never down (a source that went back is ignored until it
// passes *reported again).
void AdvanceTo(Counter* counter, double* reported, double source) {
  if (source > *reported) {
    counter->Increment(source - *reported);
    *reported = source;
  }
}

double ProcessCpuSeconds() {
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  auto secs = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6;
  };
  return secs(ru.ru_utime) + secs(ru.ru_stime);
}

}  // namespace

std::string SizeBucket(uint64_t bytes) {
  if (bytes == 0) return "0";
  uint64_t b = 1;
  while (b < (uint64_t{1} << 32) && b * 4 <= bytes) b *= 4;
  return absl::StrCat(b);
}

double BusBwFactor(std::string_view op, int nranks) {
  const double n = std::max(1, nranks);
  if (op == "allreduce") return 2 * (n - 1) / n;
  if (op == "reducescatter" || op == "allgather" || op == "alltoall" || op == "alltoallv") {
    return (n - 1) / n;
  }
  if (op == "barrier") return 0;
  return 1;  // broadcast, reduce, send, recv
}

DaemonMetrics::DaemonMetrics(std::string node_name, std::string version, uint64_t max_jobs,
                             absl::Duration gone_grace)
    : node_(std::move(node_name)),
      max_jobs_(max_jobs),
      gone_grace_(gone_grace),
      link_bytes_(registry_.AddCounter(
          "railyard_link_bytes_total",
          "Payload bytes this daemon (node) put on (direction=tx) or took off (direction=rx) the "
          "link to peer node `peer` on rail `rail`")),
      link_messages_(registry_.AddCounter("railyard_link_messages_total",
                                          "Transport messages completed on the link")),
      link_uncompressed_bytes_(registry_.AddCounter(
          "railyard_link_uncompressed_bytes_total",
          "Bytes of data that compressed collectives' messages on the link stood for, what "
          "the exact path would have sent (railyard_link_compressed_bytes_total is what they "
          "took)")),
      link_compressed_bytes_(
          registry_.AddCounter("railyard_link_compressed_bytes_total",
                               "Bytes compressed collectives' messages took on the link (a part of "
                               "railyard_link_bytes_total)")),
      link_errors_(registry_.AddCounter("railyard_link_errors_total",
                                        "Transport messages on the link that failed")),
      link_throughput_(registry_.AddGauge(
          "railyard_link_throughput_bytes_per_second",
          "Payload bytes per second on the link over the last scrape window (>= 1 s)")),
      link_integrity_errors_(registry_.AddCounter(
          "railyard_link_integrity_errors_total",
          "Messages received on the link whose CRC-32C did not match (integrity crc32c): each "
          "fails its operation with DATA_LOSS")),
      peer_rejected_(registry_.AddCounter(
          "railyard_peer_rejected_messages_total",
          "Messages that arrived for a receive on the link without the communicator's data "
          "secret (or with a wrong frame or length): dropped, the receive posted again")),
      link_stalls_(registry_.AddCounter(
          "railyard_link_stalls_total",
          "Operations failed because the link (this rail to that peer) delivered nothing for "
          "--rail_stall_timeout while the peer confirmed it was sending: a rail down")),
      link_up_(registry_.AddGauge(
          "railyard_link_up",
          "1 while the link (this rail to that peer) delivers or nothing is known against it; 0 "
          "from a stall (railyard_link_stalls_total) until a message arrives on it again")),
      coll_ops_(registry_.AddCounter("railyard_collective_ops_total",
                                     "Collectives completed on this node, by op, algorithm, "
                                     "power-of-4 size bucket (bytes, lower bound) and job")),
      coll_bytes_(registry_.AddCounter(
          "railyard_collective_bytes_total",
          "Bytes of completed collectives as nccl-tests sizes them (what algbw divides by)")),
      coll_latency_(registry_.AddHistogram(
          "railyard_collective_latency_seconds",
          "Collective time on this daemon: from the start of its execution (every local rank "
          "submitted, the previous one done) to its completion",
          Histogram::ExponentialBuckets(1e-5, 4, 12))),
      coll_algbw_(registry_.AddGauge("railyard_collective_algbw_bytes_per_second",
                                     "Algorithm bandwidth of the last collective of the key")),
      coll_busbw_(registry_.AddGauge(
          "railyard_collective_busbw_bytes_per_second",
          "Bus bandwidth (nccl-tests factor) of the last collective of the key")),
      coll_algbw_ewma_(registry_.AddGauge(
          "railyard_collective_algbw_ewma_bytes_per_second",
          "Exponentially weighted average (alpha 0.2) of the algorithm bandwidth")),
      coll_busbw_ewma_(
          registry_.AddGauge("railyard_collective_busbw_ewma_bytes_per_second",
                             "Exponentially weighted average (alpha 0.2) of the bus bandwidth")),
      coll_model_(
          registry_.AddGauge("railyard_collective_model_seconds",
                             "Cost model's predicted time of the last collective of the key")),
      job_comms_(registry_.AddGauge("railyard_job_comms", "Active communicators of the job")),
      job_queued_(registry_.AddGauge(
          "railyard_job_queued_ops",
          "Operations of the job submitted by some local rank and not yet started")),
      job_in_flight_(
          registry_.AddGauge("railyard_job_in_flight_ops", "Operations of the job executing now")),
      comm_stalled_(registry_.AddGauge(
          "railyard_comm_stalled_seconds",
          "Age of the oldest collective of the job's communicators that a rank here submitted "
          "and that has not completed (0: none); railctl diagnose says what it waits for")),
      comm_in_flight_(registry_.AddGauge(
          "railyard_comm_ops_in_flight",
          "Collectives of the job's communicators that a rank here submitted and that have not "
          "completed")),
      job_fabric_bytes_(registry_.AddCounter(
          "railyard_job_fabric_bytes_total",
          "Bytes the job's communicators sent and received over the inter-node fabric")),
      job_weight_(registry_.AddGauge(
          "railyard_job_fair_share_weight",
          "The job's weight on the paced rails' fair queues (--job_weights, railctl jobs "
          "set-weight); 1 unless set")),
      job_rail_bytes_(registry_.AddCounter(
          "railyard_job_rail_bytes_total",
          "Bytes the job sent on a paced rail, counted as each send leaves the rail's fair queue")),
      job_queue_delay_(registry_.AddHistogram(
          "railyard_job_queue_delay_seconds",
          "How long the job's sends waited in a paced rail's fair queue (0 when sent at once)",
          Histogram::ExponentialBuckets(1e-5, 4, 10))),
      sessions_(
          &registry_.AddGauge("railyard_sessions", "Connected client sessions").Add(kNoLabels)),
      buffer_bytes_(&registry_
                         .AddGauge("railyard_registered_buffer_bytes",
                                   "Bytes of client buffers mapped by the daemon")
                         .Add(kNoLabels)),
      communicators_(
          &registry_.AddGauge("railyard_communicators", "Live communicators").Add(kNoLabels)),
      cpu_seconds_(&registry_
                        .AddCounter("railyard_process_cpu_seconds_total",
                                    "User and system CPU time of the daemon process (getrusage)")
                        .Add(kNoLabels)),
      ucx_endpoints_(&registry_
                          .AddGauge("railyard_ucx_endpoints",
                                    "Transport endpoints to other daemons held by communicators")
                          .Add(kNoLabels)),
      staging_leased_(&registry_
                           .AddGauge("railyard_staging_host_bytes",
                                     "Page-locked host memory staging device buffers across "
                                     "nodes: on lease to operations, or idle and kept for reuse")
                           .Add({{"state", "leased"}})),
      staging_idle_(
          &registry_.AddGauge("railyard_staging_host_bytes", "").Add({{"state", "idle"}})),
      staging_allocated_(&registry_
                              .AddCounter("railyard_staging_buffers_total",
                                          "Staging leases, by whether the buffer was allocated "
                                          "and page-locked for it or reused from the pool")
                              .Add({{"buffer", "allocated"}})),
      staging_reused_(
          &registry_.AddCounter("railyard_staging_buffers_total", "").Add({{"buffer", "reused"}})),
      op_timeouts_(&registry_
                        .AddCounter("railyard_op_timeouts_total",
                                    "Communicators failed because an operation or join timed out")
                        .Add(kNoLabels)),
      comm_aborts_(&registry_
                        .AddCounter("railyard_comm_aborts_total",
                                    "Communicators aborted with operations failing")
                        .Add(kNoLabels)),
      desyncs_(&registry_
                    .AddCounter("railyard_desync_detections_total",
                                "Mismatched submissions detected (ranks disagreeing on op, "
                                "count, dtype, root, redop or algorithm)")
                    .Add(kNoLabels)),
      peer_failures_(&registry_
                          .AddCounter("railyard_peer_failures_total",
                                      "Peer daemons declared dead (heartbeats unanswered)")
                          .Add(kNoLabels)) {
  registry_.AddGauge("railyard_build_info", "Always 1; labels say what runs")
      .Add({{"version", std::move(version)}, {"node", node_}})
      .Set(1);
  registry_.AddCollectHook([this] { Scrape(); });
}

const LinkCounters* DaemonMetrics::ForLink(const std::string& peer, const std::string& rail) {
  absl::MutexLock lock(&mu_);
  auto& slot = links_[{peer, rail}];
  if (slot == nullptr) {
    slot = std::make_unique<LinkCounters>();
    auto labels = [&](std::string_view dir) {
      return Labels{{"node", node_}, {"peer", peer}, {"rail", rail}, {"direction", dir.data()}};
    };
    slot->tx_bytes = &link_bytes_.Add(labels("tx"));
    slot->rx_bytes = &link_bytes_.Add(labels("rx"));
    slot->tx_messages = &link_messages_.Add(labels("tx"));
    slot->rx_messages = &link_messages_.Add(labels("rx"));
    slot->tx_uncompressed_bytes = &link_uncompressed_bytes_.Add(labels("tx"));
    slot->rx_uncompressed_bytes = &link_uncompressed_bytes_.Add(labels("rx"));
    slot->tx_compressed_bytes = &link_compressed_bytes_.Add(labels("tx"));
    slot->rx_compressed_bytes = &link_compressed_bytes_.Add(labels("rx"));
    slot->tx_errors = &link_errors_.Add(labels("tx"));
    slot->rx_errors = &link_errors_.Add(labels("rx"));
    link_throughput_.Add(labels("tx"));
    link_throughput_.Add(labels("rx"));
    const Labels link{{"node", node_}, {"peer", peer}, {"rail", rail}};
    slot->integrity_errors = &link_integrity_errors_.Add(link);
    slot->rejected_messages = &peer_rejected_.Add(link);
    slot->stalls = &link_stalls_.Add(link);
    slot->up = &link_up_.Add(link);
    slot->up->Set(1);
  }
  return slot.get();
}

const std::string& DaemonMetrics::TouchJobLocked(const std::string& job) {
  auto [it, inserted] = jobs_.try_emplace(job);
  if (inserted) {
    if (job != kOtherJob && (max_jobs_ == 0 || own_jobs_ < max_jobs_)) {
      it->second.label = job;
      ++own_jobs_;
    } else {
      it->second.label = kOtherJob;
      other_series_ = true;
    }
  }
  it->second.seen = epoch_;
  it->second.gone_since = absl::InfiniteFuture();
  return it->second.label;
}

std::string DaemonMetrics::JobLabel(const std::string& job) {
  absl::MutexLock lock(&mu_);
  return TouchJobLocked(job);
}

void DaemonMetrics::RemoveJobSeriesLocked(const std::string& label) {
  for (auto it = collectives_.begin(); it != collectives_.end();) {
    it = std::get<3>(it->first) == label ? collectives_.erase(it) : std::next(it);
  }
  for (Family<Counter>* f : {&coll_ops_, &coll_bytes_, &job_fabric_bytes_, &job_rail_bytes_}) {
    f->RemoveWhere("job", label);
  }
  job_queue_delay_.RemoveWhere("job", label);
  for (auto it = rail_series_.begin(); it != rail_series_.end();) {
    it = it->first.first == label ? rail_series_.erase(it) : std::next(it);
  }
  for (Family<Gauge>* f :
       {&coll_algbw_, &coll_busbw_, &coll_algbw_ewma_, &coll_busbw_ewma_, &coll_model_, &job_comms_,
        &job_queued_, &job_in_flight_, &job_weight_, &comm_stalled_, &comm_in_flight_}) {
    f->RemoveWhere("job", label);
  }
  coll_latency_.RemoveWhere("job", label);
}

std::shared_ptr<Counter> DaemonMetrics::JobFabricBytes(const std::string& job) {
  absl::MutexLock lock(&mu_);
  return job_fabric_bytes_.Hold({{"job", TouchJobLocked(job)}});
}

void DaemonMetrics::RecordRailSend(const std::string& job, const std::string& rail, size_t bytes,
                                   double waited_s) {
  absl::MutexLock lock(&mu_);
  const std::string& label = TouchJobLocked(job);
  RailSeries& s = rail_series_[{label, rail}];
  if (s.bytes == nullptr) {
    const Labels labels{{"job", label}, {"rail", rail}};
    s.bytes = &job_rail_bytes_.Add(labels);
    s.delay = &job_queue_delay_.Add(labels);
  }
  s.bytes->Increment(static_cast<double>(bytes));
  s.delay->Observe(waited_s);
}

void DaemonMetrics::RecordCollective(const CollectiveRecord& r) {
  const std::string bucket = SizeBucket(r.bytes);
  const double seconds = absl::ToDoubleSeconds(r.elapsed);
  absl::MutexLock lock(&mu_);
  auto key = std::make_tuple(std::string(r.op), std::string(r.algorithm), bucket,
                             TouchJobLocked(std::string(r.job)));
  CollectiveSeries& s = collectives_[key];
  if (s.ops == nullptr) {
    const Labels labels{{"op", std::get<0>(key)},
                        {"algorithm", std::get<1>(key)},
                        {"size_bucket", bucket},
                        {"job", std::get<3>(key)}};
    s.ops = &coll_ops_.Add(labels);
    s.bytes = &coll_bytes_.Add(labels);
    s.latency = &coll_latency_.Add(labels);
    s.algbw = &coll_algbw_.Add(labels);
    s.busbw = &coll_busbw_.Add(labels);
    s.algbw_ewma = &coll_algbw_ewma_.Add(labels);
    s.busbw_ewma = &coll_busbw_ewma_.Add(labels);
  }
  s.ops->Increment();
  s.bytes->Increment(static_cast<double>(r.bytes));
  s.latency->Observe(seconds);
  if (seconds <= 0 || r.bytes == 0) return;  // no bandwidth to speak of
  const double algbw = static_cast<double>(r.bytes) / seconds;
  const double busbw = algbw * BusBwFactor(r.op, r.nranks);
  s.algbw->Set(algbw);
  s.busbw->Set(busbw);
  if (!s.seen) {
    s.algbw_ewma->Set(algbw);
    s.busbw_ewma->Set(busbw);
    s.seen = true;
  } else {
    s.algbw_ewma->Set(kEwmaAlpha * algbw + (1 - kEwmaAlpha) * s.algbw_ewma->Value());
    s.busbw_ewma->Set(kEwmaAlpha * busbw + (1 - kEwmaAlpha) * s.busbw_ewma->Value());
  }
}

void DaemonMetrics::SetModelPrediction(std::string_view op, std::string_view algorithm,
                                       uint64_t bytes, std::string_view job, double seconds) {
  absl::MutexLock lock(&mu_);
  coll_model_
      .Add({{"op", std::string(op)},
            {"algorithm", std::string(algorithm)},
            {"size_bucket", SizeBucket(bytes)},
            {"job", TouchJobLocked(std::string(job))}})
      .Set(seconds);
}

void DaemonMetrics::AddJob(const std::string& job) {
  absl::MutexLock lock(&mu_);
  const Labels labels{{"job", TouchJobLocked(job)}};
  job_comms_.Add(labels);
  job_queued_.Add(labels);
  job_in_flight_.Add(labels);
  comm_stalled_.Add(labels);
  comm_in_flight_.Add(labels);
  job_weight_.Add(labels).Set(1);
  job_fabric_bytes_.Add(labels);
}

void DaemonMetrics::SetSampler(std::function<DaemonSample()> sampler) {
  absl::MutexLock lock(&mu_);
  sampler_ = std::move(sampler);
}

void DaemonMetrics::SetClock(std::function<absl::Time()> now) {
  absl::MutexLock lock(&mu_);
  now_ = std::move(now);
}

void DaemonMetrics::Scrape() {
  std::function<DaemonSample()> sampler;
  uint64_t epoch = 0;
  {
    absl::MutexLock lock(&mu_);
    sampler = sampler_;
    epoch = ++epoch_;  // what happens from here on is seen by this scrape
  }
  // Outside mu_: the sampler takes the daemon's locks, which data-path threads hold while
  // calling into this class.
  DaemonSample sample;
  if (sampler) sample = sampler();

  absl::MutexLock lock(&mu_);
  sessions_->Set(sample.sessions);
  buffer_bytes_->Set(static_cast<double>(sample.registered_buffer_bytes));
  communicators_->Set(sample.communicators);
  staging_leased_->Set(static_cast<double>(sample.staging.leased_bytes));
  staging_idle_->Set(static_cast<double>(sample.staging.idle_bytes));
  AdvanceTo(staging_allocated_, &staging_allocations_reported_,
            static_cast<double>(sample.staging.allocations));
  AdvanceTo(staging_reused_, &staging_reuses_reported_, static_cast<double>(sample.staging.reuses));
  AdvanceTo(cpu_seconds_, &cpu_reported_, ProcessCpuSeconds());
  // The jobs alive, summed by label (the jobs past max_jobs_ under kOtherJob).
  std::map<std::string, JobSample> by_label;
  for (const auto& [job, j] : sample.jobs) {
    JobSample& sum = by_label[TouchJobLocked(job)];
    sum.comms += j.comms;
    sum.queued_ops += j.queued_ops;
    sum.in_flight_ops += j.in_flight_ops;
    sum.pending_collectives += j.pending_collectives;
    sum.stalled_seconds = std::max(sum.stalled_seconds, j.stalled_seconds);
    sum.weight = j.weight;  // "other" shows the weight of one of its jobs
  }
  // A job gone for gone_grace_, and shown gone (at 0) by an earlier scrape, loses its series,
  // unless a communicator still counts its fabric bytes.
  const absl::Time gone_now = now_();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    JobEntry& e = it->second;
    if (e.seen >= epoch) {  // alive in this sample, or touched since it was taken
      ++it;
      continue;
    }
    if (e.gone_since == absl::InfiniteFuture()) e.gone_since = gone_now;
    if (e.seen + 1 >= epoch || gone_now - e.gone_since < gone_grace_) {
      ++it;
      continue;
    }
    if (e.label != kOtherJob) {
      if (job_fabric_bytes_.HeldElsewhere({{"job", e.label}})) {
        ++it;
        continue;
      }
      RemoveJobSeriesLocked(e.label);
      --own_jobs_;
    }
    it = jobs_.erase(it);
  }
  bool other_alive = job_fabric_bytes_.HeldElsewhere({{"job", kOtherJob}});
  for (const auto& [job, e] : jobs_) other_alive |= e.label == kOtherJob;
  if (other_alive) {
    by_label.try_emplace(kOtherJob);
  } else if (other_series_) {
    RemoveJobSeriesLocked(kOtherJob);
    other_series_ = false;
  }
  // Every label left shows, at 0 when its jobs have nothing now (a vanished gauge reads as "no
  // data" until the job is removed).
  for (const auto& [job, e] : jobs_) by_label.try_emplace(e.label);
  for (const auto& [label, j] : by_label) {
    const Labels labels{{"job", label}};
    job_comms_.Add(labels).Set(j.comms);
    job_queued_.Add(labels).Set(j.queued_ops);
    job_in_flight_.Add(labels).Set(j.in_flight_ops);
    comm_stalled_.Add(labels).Set(j.stalled_seconds);
    comm_in_flight_.Add(labels).Set(j.pending_collectives);
    auto w = sample.job_weights.find(label);
    job_weight_.Add(labels).Set(w != sample.job_weights.end() ? w->second : j.weight);
    job_fabric_bytes_.Add(labels);
  }

  const absl::Time now = absl::Now();
  if (now - last_rate_sample_ < kRateWindow) return;
  const double dt = absl::ToDoubleSeconds(now - last_rate_sample_);
  const bool first = last_rate_sample_ == absl::InfinitePast();
  last_rate_sample_ = now;
  for (const auto& [key, link] : links_) {
    const auto& [peer, rail] = key;
    for (const auto& [counter, dir] :
         {std::pair{link->tx_bytes, "tx"}, std::pair{link->rx_bytes, "rx"}}) {
      const double v = counter->Value();
      auto [it, inserted] = last_rate_value_.try_emplace(counter, v);
      const double rate = first || inserted ? 0 : (v - it->second) / dt;
      it->second = v;
      link_throughput_.Add({{"node", node_}, {"peer", peer}, {"rail", rail}, {"direction", dir}})
          .Set(rate);
    }
  }
}

}  // namespace railyard::metrics
