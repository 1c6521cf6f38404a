#include "daemon/core/fair_share.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/comm/peer_input.h"
#include "daemon/topology/units.h"
#include "daemon/util/log.h"

namespace railyard {
namespace {

// Jobs that have sent on a paced rail whose totals are kept; past it, those of jobs with no
// session and no communicator are dropped (the metrics keep the history).
constexpr size_t kMaxShareJobs = 1024;
// On a paced rail a message should hold the link about this long at most: the granularity at
// which the fair queue interleaves jobs (256 KiB at 110 MB/s is 2.4 ms). 1 ms (64 KiB there)
// measured worse on 2 cores: per-message costs took 7% of a job's speed alone and 3:1 fell to
// 2.2:1 (bench/results/fairness.txt).
constexpr double kPacedSliceSeconds = 2.5e-3;

}  // namespace

FairShare::FairShare(std::string weights_file, Deps deps)
    : weights_file_(std::move(weights_file)), deps_(deps) {}

void FairShare::StartRails(const v1::NodeTopology& topology) {
  rail_queues_.assign(topology.rails_size(), nullptr);
  rail_names_.clear();
  for (int r = 0; r < topology.rails_size(); ++r) {
    const v1::Rail& rail = topology.rails(r);
    rail_names_.push_back(rail.name().empty() ? absl::StrCat("rail", r) : rail.name());
    if (rail.pace().empty()) continue;
    // Validated when the topology was loaded (topology_file.cc).
    absl::StatusOr<double> rate = topology::ParseBandwidth(rail.pace());
    if (!rate.ok() || *rate <= 0) continue;
    transport::FairQueue::Options o;
    o.rail = rail_names_.back();
    o.schedule.rate_bytes_per_s = *rate;
    o.schedule.weight = [this](const std::string& job) { return weights_.Get(job); };
    o.on_sent = [this, r](const std::string& job, size_t bytes, double waited_s) {
      RecordSend(r, job, bytes, waited_s);
    };
    rail_queues_[r] = std::make_shared<transport::FairQueue>(std::move(o));
    Log(LogLevel::kInfo, "fair", "rail paced",
        {F("rail", rail_names_.back()), F("pace", topology::FormatBandwidth(*rate))});
  }
}

uint64_t FairShare::PacedChunkBytes() const {
  double slowest = 0;
  for (const auto& q : rail_queues_) {
    if (q != nullptr && (slowest == 0 || q->rate() < slowest)) slowest = q->rate();
  }
  if (slowest <= 0) return 0;
  const double target = std::min(slowest * kPacedSliceSeconds, 4.0 * 1024 * 1024);
  uint64_t c = kMinPacedChunkBytes;
  while (static_cast<double>(c * 2) <= target) c *= 2;
  return c;
}

void FairShare::Shutdown() {
  for (auto& q : rail_queues_) {
    if (q != nullptr) q->Shutdown();
  }
}

void FairShare::RecordSend(int rail, const std::string& job, size_t bytes, double waited_s) {
  if (deps_.metrics != nullptr)
    deps_.metrics->RecordRailSend(job, rail_names_[rail], bytes, waited_s);
  absl::MutexLock l(&shares_mu_);
  RailShare& s = shares_[{job, rail}];
  s.bytes += bytes;
  ++s.sends;
  s.delay_total_s += waited_s;
  s.delay_max_s = std::max(s.delay_max_s, waited_s);
}

absl::Status FairShare::LoadWeights() {
  if (weights_file_.empty()) return absl::OkStatus();
  absl::Status s = weights_.Load(weights_file_);
  if (s.ok()) {
    Log(LogLevel::kInfo, "fair", "job weights loaded",
        {F("file", weights_file_), F("jobs", weights_.Snapshot().size())});
  }
  return s;
}

void FairShare::ReloadWeights() {
  if (weights_file_.empty()) {
    Log(LogLevel::kInfo, "fair", "SIGHUP: no --job_weights file to reload");
    return;
  }
  std::vector<std::string> dropped;
  absl::Status s = weights_.Load(weights_file_, &dropped);
  if (!s.ok()) {
    Log(LogLevel::kError, "fair", "job weights not reloaded: the previous weights stay",
        {F("file", weights_file_), F("error", s.message())});
    return;
  }
  Log(LogLevel::kInfo, "fair", "job weights reloaded",
      {F("file", weights_file_), F("jobs", weights_.Snapshot().size()),
       F("admin_weights_replaced", absl::StrJoin(dropped, ","))});
}

absl::StatusOr<double> FairShare::SetWeight(const std::string& job, double weight) {
  absl::StatusOr<double> previous = weights_.Set(job, weight);
  if (previous.ok()) {
    Log(LogLevel::kInfo, "fair", "job weight set",
        {F("job", job), F("weight", weight), F("previous", *previous)});
  }
  return previous;
}

v1::ListJobsResponse FairShare::ListJobs() {
  v1::ListJobsResponse out;
  std::map<std::string, v1::JobShare> jobs;
  if (deps_.sessions != nullptr) {
    for (const auto& s : deps_.sessions->Snapshot()) {
      v1::JobShare& j = jobs[s->job()];
      j.set_sessions(j.sessions() + 1);
    }
  }
  if (deps_.comms != nullptr) {
    for (const auto& c : deps_.comms->Snapshot()) {
      const CommStats st = c->Stats();
      v1::JobShare& j = jobs[st.job];
      j.set_comms(j.comms() + 1);
    }
  }
  const std::map<std::string, JobWeights::Entry> weights = weights_.Snapshot();
  for (const auto& [job, e] : weights) jobs[job];
  {
    absl::MutexLock l(&shares_mu_);
    std::set<std::string> share_jobs;
    for (const auto& [key, s] : shares_) share_jobs.insert(key.first);
    if (share_jobs.size() > kMaxShareJobs) {
      for (auto it = shares_.begin(); it != shares_.end();) {
        it = jobs.count(it->first.first) == 0 ? shares_.erase(it) : std::next(it);
      }
    }
    for (const auto& [key, s] : shares_) {
      v1::JobRailShare* r = jobs[key.first].add_rails();
      r->set_rail(rail_names_[key.second]);
      r->set_bytes_sent(s.bytes);
      r->set_sends(s.sends);
      r->set_queue_delay_seconds_total(s.delay_total_s);
      r->set_queue_delay_seconds_max(s.delay_max_s);
    }
  }
  for (auto& [job, j] : jobs) {
    j.set_job_id(job);
    auto it = weights.find(job);
    j.set_weight(it == weights.end() ? JobWeights::kDefault : it->second.weight);
    j.set_weight_source(it == weights.end() ? "default" : it->second.source);
    *out.add_jobs() = std::move(j);
  }
  for (int r = 0; r < static_cast<int>(rail_names_.size()); ++r) {
    v1::RailPacing* p = out.add_rails();
    p->set_rail(rail_names_[r]);
    if (rail_queues_[r] != nullptr) {
      p->set_pace_bytes_per_second(rail_queues_[r]->rate());
      p->set_queued_bytes(rail_queues_[r]->queued_bytes());
      p->set_queued_sends(rail_queues_[r]->queued_items());
    }
  }
  out.set_weights_file(weights_file_);
  out.set_weights_loads(weights_.loads());
  return out;
}

}  // namespace railyard
