// The sessions a daemon serves and the jobs they belong to: who may connect as which job (fixed
// tokens from --job_tokens, else the token a job's first session set), the live sessions by id,
// and how many each job has. Thread-safe; never calls out while holding its lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/session/session.h"

namespace railyard {

class SessionRegistry {
 public:
  // fixed_tokens: job -> token; empty: the first session of a job sets its token.
  explicit SessionRegistry(std::map<std::string, std::string> fixed_tokens);

  // A new session of job with token. INVALID_ARGUMENT for a malformed job id, PERMISSION_DENIED
  // for a job not listed or a wrong token, UNAVAILABLE once Close()d.
  absl::StatusOr<std::shared_ptr<Session>> Open(const std::string& job, const std::string& token,
                                                int64_t pid, const std::string& client);
  // NOT_FOUND for an unknown (or removed) session id.
  absl::StatusOr<std::shared_ptr<Session>> Find(const std::string& session_id) const;
  // Forgets the session; the job's token goes with its last session. False when it was not
  // registered (already removed).
  bool Remove(const std::shared_ptr<Session>& session);
  // Refuses every later Open; returns the sessions registered now.
  std::vector<std::shared_ptr<Session>> Close();

  std::vector<std::shared_ptr<Session>> Snapshot() const;
  // Jobs with at least one session.
  size_t jobs() const;

 private:
  struct Job {
    std::string token;
    int sessions = 0;
  };
  const std::map<std::string, std::string> fixed_tokens_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard
