// What railyardd measures, by name: the metric families of docs (README "Dashboards") and the
// few calls the data path makes to update them. One instance per daemon, owned by DaemonCore.
//
// Hot path: a link's counters are looked up once per communicator (ForLink) and then updated
// lock-free per message; a collective's series are looked up once per operation (a short map
// lookup under a lock taken once per collective, never per chunk).
//
// Bounded cardinality: the first max_jobs jobs alive at once get series labelled job="<id>"; the
// others are summed under job="other" (kOtherJob; a job named "other" shares it). The series of
// a job that is gone (no session, no communicator in the sampler's DaemonSample, and no
// communicator still counting its fabric bytes) are removed from the exposition once it has been
// gone for gone_grace (its final values stay visible to scrapes and dashboards a while) and at
// least one scrape showed it gone (so a job that lived between two scrapes still shows); its
// own-series place then goes to the next new job.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/metrics/registry.h"

namespace railyard::metrics {

// The counters of one (this node, peer node, rail) link, both directions.
struct LinkCounters {
  Counter* tx_bytes = nullptr;
  Counter* rx_bytes = nullptr;
  Counter* tx_messages = nullptr;
  Counter* rx_messages = nullptr;
  Counter* tx_errors = nullptr;
  Counter* rx_errors = nullptr;
  // Received messages that failed the end-to-end checksum (integrity "crc32c"): corruption
  // between the peer's send buffer and this node's receive buffer.
  Counter* integrity_errors = nullptr;
  // Received messages that were not the member's (wrong secret, magic or length): dropped, and
  // the receive posted again (daemon/transport/framed_endpoint.h).
  Counter* rejected_messages = nullptr;
  // Operations failed because this rail stopped delivering from the peer while the peer
  // confirmed it was sending (--rail_stall_timeout, daemon/diagnose/rail_check.h): a link down.
  Counter* stalls = nullptr;
  // 1 while the link delivers (or nothing is known against it); 0 from a stall (above) until a
  // message arrives on it again.
  Gauge* up = nullptr;
  // Compressed operations (docs/compression.md): the float32 bytes their messages stood for, and
  // the bytes those messages took (also counted in tx_bytes/rx_bytes, with the exact traffic).
  Counter* tx_uncompressed_bytes = nullptr;
  Counter* rx_uncompressed_bytes = nullptr;
  Counter* tx_compressed_bytes = nullptr;
  Counter* rx_compressed_bytes = nullptr;
};

// Power-of-4 bucket of a message size, as a bounded label: "0", "1", "4", "16", ... "4294967296"
// (the lower bound in bytes; everything from 4 GiB up shares the last one).
std::string SizeBucket(uint64_t bytes);
// nccl-tests' bus bandwidth factor for an op name of scheduler::OpName on nranks ranks.
double BusBwFactor(std::string_view op, int nranks);

// One finished collective, as the communicator saw it.
struct CollectiveRecord {
  std::string_view op;         // scheduler::OpName
  std::string_view algorithm;  // schedule's algorithm; "local" for single-node plans
  std::string_view job;
  uint64_t bytes = 0;  // nccl-tests' size: what algbw divides by the time
  int nranks = 1;
  absl::Duration elapsed;
};

// Daemon state sampled at scrape time (DaemonCore fills it).
struct JobSample {
  int comms = 0;
  int queued_ops = 0;
  int in_flight_ops = 0;
  double weight = 1;  // on the paced rails' fair queues (daemon/session/job_weights.h)
  // Collectives some local rank submitted that have not completed, and the oldest one's age
  // (railctl diagnose tells which rank, node or link they wait for).
  int pending_collectives = 0;
  double stalled_seconds = 0;
};
// The page-locked host buffers that stage device memory across nodes (device::StagingPool).
struct StagingSample {
  uint64_t leased_bytes = 0;  // capacity of the buffers out on lease
  uint64_t idle_bytes = 0;    // kept for reuse
  uint64_t allocations = 0;   // buffers allocated and page-locked, since the start
  uint64_t reuses = 0;        // leases served by a kept buffer, since the start
};
struct DaemonSample {
  int sessions = 0;
  uint64_t registered_buffer_bytes = 0;
  int communicators = 0;
  StagingSample staging;
  std::map<std::string, JobSample> jobs;
  // Weights set for jobs (alive or not): a job that ended keeps showing its weight.
  std::map<std::string, double> job_weights;
};

// The job label of the jobs past DaemonMetrics' max_jobs.
inline constexpr char kOtherJob[] = "other";

class DaemonMetrics {
 public:
  // max_jobs: jobs with series of their own at once (--max_metric_jobs; 0: no limit);
  // gone_grace: how long the series of a job that ended stay.
  DaemonMetrics(std::string node_name, std::string version, uint64_t max_jobs = 64,
                absl::Duration gone_grace = kGoneJobGrace);
  static constexpr absl::Duration kGoneJobGrace = absl::Minutes(2);
  DaemonMetrics(const DaemonMetrics&) = delete;
  DaemonMetrics& operator=(const DaemonMetrics&) = delete;

  Registry& registry() { return registry_; }
  const std::string& node_name() const { return node_; }

  // Counters of the link to peer node `peer` on rail `rail` (names). Stable pointer.
  const LinkCounters* ForLink(const std::string& peer, const std::string& rail);
  // Bytes a job's communicators moved over the fabric (sent plus received). Held by the caller:
  // valid however long it keeps it; while some caller keeps it the job's series stay.
  std::shared_ptr<Counter> JobFabricBytes(const std::string& job);
  // One send of job's leaving a paced rail's fair queue after waiting waited_s: counts its bytes
  // (railyard_job_rail_bytes_total) and its queueing delay (railyard_job_queue_delay_seconds).
  // On the data path (once per message on a paced rail): one map lookup under the lock.
  void RecordRailSend(const std::string& job, const std::string& rail, size_t bytes,
                      double waited_s);
  // The job label the series of job carry: job itself, or kOtherJob.
  std::string JobLabel(const std::string& job);
  // Endpoints to other daemons in use by communicators.
  Gauge* ucx_endpoints() { return ucx_endpoints_; }

  void RecordCollective(const CollectiveRecord& r);
  // The cost model's predicted time of the last operation of this key (scheduler::Tuner's
  // predicted_s). Not called until a model predicts.
  void SetModelPrediction(std::string_view op, std::string_view algorithm, uint64_t bytes,
                          std::string_view job, double seconds);

  void CountOpTimeout() { op_timeouts_->Increment(); }
  void CountCommAbort() { comm_aborts_->Increment(); }
  void CountDesync() { desyncs_->Increment(); }
  void CountPeerFailure() { peer_failures_->Increment(); }

  // Creates the job's series (at 0) when a job first connects, so that a job shows up even when
  // no scrape fell within its life.
  void AddJob(const std::string& job);

  // Called at every scrape to refresh the daemon and job gauges.
  void SetSampler(std::function<DaemonSample()> sampler);
  // What "now" is for gone_grace (default absl::Now; tests).
  void SetClock(std::function<absl::Time()> now);

 private:
  struct CollectiveSeries {
    Counter* ops = nullptr;
    Counter* bytes = nullptr;
    Histogram* latency = nullptr;
    Gauge* algbw = nullptr;
    Gauge* busbw = nullptr;
    Gauge* algbw_ewma = nullptr;
    Gauge* busbw_ewma = nullptr;
    bool seen = false;
  };
  // A job with series: the label they carry, the scrape (epoch_) that last saw it alive, and
  // since when scrapes have not.
  struct JobEntry {
    std::string label;
    uint64_t seen = 0;
    absl::Time gone_since = absl::InfiniteFuture();
  };
  void Scrape();
  // job's label, assigned on first sight (its own while fewer than max_jobs_ jobs have theirs),
  // and marks it seen now.
  const std::string& TouchJobLocked(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the series labelled job=label from every family that has a job label.
  void RemoveJobSeriesLocked(const std::string& label) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string node_;
  const uint64_t max_jobs_;
  const absl::Duration gone_grace_;
  Registry registry_;
  Family<Counter>& link_bytes_;
  Family<Counter>& link_messages_;
  Family<Counter>& link_uncompressed_bytes_;
  Family<Counter>& link_compressed_bytes_;
  Family<Counter>& link_errors_;
  Family<Gauge>& link_throughput_;
  Family<Counter>& link_integrity_errors_;
  Family<Counter>& peer_rejected_;
  Family<Counter>& link_stalls_;
  Family<Gauge>& link_up_;
  Family<Counter>& coll_ops_;
  Family<Counter>& coll_bytes_;
  Family<Histogram>& coll_latency_;
  Family<Gauge>& coll_algbw_;
  Family<Gauge>& coll_busbw_;
  Family<Gauge>& coll_algbw_ewma_;
  Family<Gauge>& coll_busbw_ewma_;
  Family<Gauge>& coll_model_;
  Family<Gauge>& job_comms_;
  Family<Gauge>& job_queued_;
  Family<Gauge>& job_in_flight_;
  Family<Gauge>& comm_stalled_;
  Family<Gauge>& comm_in_flight_;
  Family<Counter>& job_fabric_bytes_;
  Family<Gauge>& job_weight_;
  Family<Counter>& job_rail_bytes_;
  Family<Histogram>& job_queue_delay_;
  Gauge* sessions_;
  Gauge* buffer_bytes_;
  Gauge* communicators_;
  Counter* cpu_seconds_;
  Gauge* ucx_endpoints_;
  Gauge* staging_leased_;
  Gauge* staging_idle_;
  Counter* staging_allocated_;
  Counter* staging_reused_;
  Counter* op_timeouts_;
  Counter* comm_aborts_;
  Counter* desyncs_;
  Counter* peer_failures_;

  absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::unique_ptr<LinkCounters>> links_
      ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, std::string, std::string, std::string>, CollectiveSeries>
      collectives_ ABSL_GUARDED_BY(mu_);
  std::function<DaemonSample()> sampler_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);  // by job id
  struct RailSeries {
    Counter* bytes = nullptr;
    Histogram* delay = nullptr;
  };
  // By (job label, rail).
  std::map<std::pair<std::string, std::string>, RailSeries> rail_series_ ABSL_GUARDED_BY(mu_);
  uint64_t own_jobs_ ABSL_GUARDED_BY(mu_) = 0;      // jobs_ labelled by their id
  bool other_series_ ABSL_GUARDED_BY(mu_) = false;  // kOtherJob labels some series
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;         // scrapes started
  std::function<absl::Time()> now_ ABSL_GUARDED_BY(mu_) = [] { return absl::Now(); };
  // The sources of the counters that mirror them (AdvanceTo), at the last scrape.
  double cpu_reported_ ABSL_GUARDED_BY(mu_) = 0;
  double staging_allocations_reported_ ABSL_GUARDED_BY(mu_) = 0;
  double staging_reuses_reported_ ABSL_GUARDED_BY(mu_) = 0;
  // Throughput: each link counter's value at the previous sample, and when it was taken.
  absl::Time last_rate_sample_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<const Counter*, double> last_rate_value_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard::metrics
