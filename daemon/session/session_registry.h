// The sessions a daemon serves and the jobs they belong to: who may connect as which job (signed
// tokens, fixed tokens from --job_tokens, a per-job peer uid/gid policy, or, only when asked for,
// the token a job's first session set), the live sessions by id, each job's shared quota counters,
// and the daemon-wide session limits. Thread-safe; never calls out while holding its lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/session/job_policy.h"
#include "daemon/session/quota.h"
#include "daemon/session/session.h"

namespace railyard {

struct SessionAuth {
  // job -> token (--job_tokens).
  std::map<std::string, std::string> fixed_tokens;
  // Verifies a signed token (IsSigned true) for a job: OK or PERMISSION_DENIED saying why. Null
  // when the daemon has no --token_key_file.
  std::function<bool(const std::string& token)> is_signed;
  std::function<absl::Status(const std::string& token, const std::string& job)> verify_signed;
  // --insecure_first_session_token: a job neither of the above knows takes the token its first
  // session presents.
  bool first_session_sets_token = false;
  // Which peer uids/gids may connect as a job (--job_policy); empty: any.
  JobPolicy policy;
};

class SessionRegistry {
 public:
  // limits: outlives the registry (the daemon's config).
  SessionRegistry(SessionAuth auth, const QuotaLimits* limits);

  // A new session of job with token, from the process cred says. INVALID_ARGUMENT for a malformed
  // job id; PERMISSION_DENIED saying why (policy, token: wrong, expired, foreign, missing, no
  // authentication configured); RESOURCE_EXHAUSTED at --max_sessions or --max_sessions_per_job;
  // UNAVAILABLE once Close()d.
  absl::StatusOr<std::shared_ptr<Session>> Open(const std::string& job, const std::string& token,
                                                const PeerCred& cred, const std::string& client);
  // NOT_FOUND for an unknown (or removed) session id.
  absl::StatusOr<std::shared_ptr<Session>> Find(const std::string& session_id) const;
  // Forgets the session; the job (its first-session token, its counters) goes with its last
  // session. False when it was not registered (already removed).
  bool Remove(const std::shared_ptr<Session>& session);
  // Refuses every later Open; returns the sessions registered now.
  std::vector<std::shared_ptr<Session>> Close();

  std::vector<std::shared_ptr<Session>> Snapshot() const;
  // Jobs with at least one session.
  size_t jobs() const;
  // Whether any authentication is configured at all (else every Open is refused).
  bool accepts_anyone() const;

 private:
  struct Job {
    std::string token;  // set by the first session (first_session_sets_token only)
    int sessions = 0;
    std::shared_ptr<JobUsage> usage;
  };
  // The token check of Open, outside the lock where it can be; `first_token` is filled when the
  // first-session rule applies (checked under the lock).
  absl::Status CheckToken(const std::string& job, const std::string& token,
                          bool* first_session_rule) const;

  const SessionAuth auth_;
  const QuotaLimits* const limits_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard
