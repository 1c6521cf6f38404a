// Fair share on the paced rails (docs/fair-share.md): a FairQueue per rail with a `pace` in the
// node's topology, the jobs' weights on them (--job_weights, loaded at start and on SIGHUP;
// Admin.SetJobWeight) and what each job sent on each rail, for Admin.ListJobs (railctl jobs).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/comm/comm_registry.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/session/job_weights.h"
#include "daemon/session/session_registry.h"
#include "daemon/transport/fair_queue.h"
#include "railyard/v1/admin.pb.h"
#include "railyard/v1/topology.pb.h"

namespace railyard {

class FairShare {
 public:
  // weights_file: --job_weights ("" for none). metrics may be null (nothing recorded); sessions
  // and comms (for ListJobs' counts) may be null (none counted). All must outlive Shutdown().
  struct Deps {
    metrics::DaemonMetrics* metrics = nullptr;
    SessionRegistry* sessions = nullptr;
    CommRegistry* comms = nullptr;
  };
  FairShare(std::string weights_file, Deps deps);
  FairShare(const FairShare&) = delete;
  FairShare& operator=(const FairShare&) = delete;

  // The node's rails (EnableMultiNode, before any communicator exists): a name each, and a fair
  // queue for each rail with a pace (its thread starts here).
  void StartRails(const v1::NodeTopology& topology);
  const std::vector<std::string>& rail_names() const { return rail_names_; }
  // By rail; null for an unpaced rail.
  const std::vector<std::shared_ptr<transport::FairQueue>>& rail_queues() const {
    return rail_queues_;
  }
  // NodeInfo.paced_chunk_bytes: the power of two at or below 2.5 ms at the slowest paced rail's
  // rate, within [kMinPacedChunkBytes, 4 MiB]; 0 without a paced rail.
  uint64_t PacedChunkBytes() const;
  // Sends still queued go out now (and fail: their communicators are aborted); the queues'
  // threads stop. Idempotent.
  void Shutdown();

  // --job_weights at start (an error stops the daemon) and on SIGHUP (an error keeps the
  // weights in use, and is logged).
  absl::Status LoadWeights();
  void ReloadWeights();
  // Admin.SetJobWeight: the previous weight.
  absl::StatusOr<double> SetWeight(const std::string& job, double weight);
  double Weight(const std::string& job) const { return weights_.Get(job); }
  std::map<std::string, JobWeights::Entry> Weights() const { return weights_.Snapshot(); }
  v1::ListJobsResponse ListJobs();

 private:
  // A send leaving rail's fair queue (on the thread that issues it).
  void RecordSend(int rail, const std::string& job, size_t bytes, double waited_s);

  const std::string weights_file_;
  const Deps deps_;
  // Read by the rail queues' threads: declared before them.
  JobWeights weights_;
  struct RailShare {
    uint64_t bytes = 0;
    uint64_t sends = 0;
    double delay_total_s = 0;
    double delay_max_s = 0;
  };
  absl::Mutex shares_mu_;
  std::map<std::pair<std::string, int>, RailShare> shares_ ABSL_GUARDED_BY(shares_mu_);
  // Set once by StartRails, before communicators exist.
  std::vector<std::string> rail_names_;
  std::vector<std::shared_ptr<transport::FairQueue>> rail_queues_;
};

}  // namespace railyard
