// What one client may hold on a node: limits per session and per job (flags --max_*), and the
// counters that enforce them. A charge is all-or-nothing: when it would take the session or the
// job past its limit nothing is charged and the error names the limit and the flag that sets it.
// Lock-free (atomics); safe from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"

namespace railyard {

// Resources counted per session and per job.
enum class Resource : int {
  kBuffers = 0,      // registered buffers
  kBufferBytes,      // bytes of registered buffers
  kComms,            // communicator memberships
  kQueuedOps,        // collectives submitted that have not started (ahead of the slowest rank)
  kQueuedP2p,        // send/recv messages waiting for their peer
  kCompletionBytes,  // bytes of completion events not yet written to the client's stream
  kResidualBytes,    // bytes of error-feedback residuals (docs/compression.md)
  kCount
};
constexpr int kResourceCount = static_cast<int>(Resource::kCount);

// "registered buffers", ...: what the error message calls it.
const char* ResourceName(Resource r);
// "max_buffers_per_session", "max_buffers_per_job", ...: the flags (without "--").
const char* SessionFlag(Resource r);
const char* JobFlag(Resource r);

struct QuotaLimits {
  // Indexed by Resource. 0 means unlimited.
  std::array<uint64_t, kResourceCount> per_session{};
  std::array<uint64_t, kResourceCount> per_job{};
  // Per daemon.
  uint64_t max_sessions = 1024;
  uint64_t max_sessions_per_job = 256;
  // Jobs with their own metric series; later jobs are summed under job="other".
  uint64_t max_metric_jobs = 64;

  static QuotaLimits Defaults();
  uint64_t session_limit(Resource r) const { return per_session[static_cast<int>(r)]; }
  uint64_t job_limit(Resource r) const { return per_job[static_cast<int>(r)]; }
};

// What a job's sessions hold together.
class JobUsage {
 public:
  explicit JobUsage(std::string job) : job_(std::move(job)) {}
  const std::string& job() const { return job_; }
  uint64_t used(Resource r) const { return used_[static_cast<int>(r)].load(); }

 private:
  friend class QuotaAccount;
  const std::string job_;
  std::array<std::atomic<uint64_t>, kResourceCount> used_{};
};

// Which limits may refuse a charge.
enum class Enforce {
  kSessionAndJob,
  // The job is charged even past its limit: for work that lets the job's other work progress
  // (the slowest rank's collective, which the job's other ranks wait for), which the job's own
  // backlog must not block; the session's limit still bounds it.
  kSessionOnly,
};

// One session's counters, charged together with its job's.
class QuotaAccount {
 public:
  QuotaAccount(const QuotaLimits* limits, std::shared_ptr<JobUsage> job)
      : limits_(limits), job_(std::move(job)) {}

  // Adds n units of r. RESOURCE_EXHAUSTED ("<resource> limit of this session (L) reached: it holds
  // U and asked for n more (--flag)"), and nothing charged, when the session or its job would pass
  // its limit (only the session under Enforce::kSessionOnly). n == 0 always succeeds.
  absl::Status Charge(Resource r, uint64_t n, Enforce enforce = Enforce::kSessionAndJob);
  // Adds n units of r even past the limits: for what the daemon owes a client and must not refuse
  // (the completions of operations it accepted). CheckBelow then refuses new work until it is
  // taken back.
  void ChargePastLimit(Resource r, uint64_t n);
  // Takes back n units charged before.
  void Release(Resource r, uint64_t n);
  // Fails like Charge when the session or its job is already at or over its limit of r (for
  // resources charged by the daemon itself, like completion backlog, checked before new work).
  absl::Status CheckBelow(Resource r) const;

  uint64_t used(Resource r) const { return used_[static_cast<int>(r)].load(); }
  const JobUsage& job() const { return *job_; }
  const QuotaLimits& limits() const { return *limits_; }

 private:
  const QuotaLimits* const limits_;
  const std::shared_ptr<JobUsage> job_;
  std::array<std::atomic<uint64_t>, kResourceCount> used_{};
};

// A charge given back when this is destroyed (movable, not copyable): for things whose life ends
// somewhere else than where they were charged (a queued operation, a queued message).
class QuotaCharge {
 public:
  QuotaCharge() = default;
  // Charges n of r to account; check ok() (or status()) before relying on it.
  static absl::Status Take(std::shared_ptr<QuotaAccount> account, Resource r, uint64_t n,
                           QuotaCharge* out, Enforce enforce = Enforce::kSessionAndJob);
  // Charges n of r to account even past its limits (QuotaAccount::ChargePastLimit); a null
  // account charges nothing.
  static QuotaCharge TakePastLimit(std::shared_ptr<QuotaAccount> account, Resource r, uint64_t n);
  ~QuotaCharge() { Reset(); }
  QuotaCharge(QuotaCharge&& o) noexcept { *this = std::move(o); }
  QuotaCharge& operator=(QuotaCharge&& o) noexcept;
  QuotaCharge(const QuotaCharge&) = delete;
  QuotaCharge& operator=(const QuotaCharge&) = delete;
  // Releases now.
  void Reset();
  uint64_t amount() const { return n_; }

 private:
  std::shared_ptr<QuotaAccount> account_;
  Resource r_ = Resource::kBuffers;
  uint64_t n_ = 0;
};

}  // namespace railyard
