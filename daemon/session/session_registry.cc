#include "daemon/session/session_registry.h"

#include <openssl/crypto.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/session/job_tokens.h"
#include "daemon/util/random_id.h"

namespace railyard {
namespace {

// Equal strings, in time that depends only on their lengths.
bool SameSecret(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

SessionRegistry::SessionRegistry(SessionAuth auth, const QuotaLimits* limits)
    : auth_(std::move(auth)), limits_(limits) {}

bool SessionRegistry::accepts_anyone() const {
  return auth_.verify_signed != nullptr || !auth_.fixed_tokens.empty() ||
         auth_.first_session_sets_token;
}

absl::Status SessionRegistry::CheckToken(const std::string& job, const std::string& token,
                                         bool* first_session_rule) const {
  *first_session_rule = false;
  if (auth_.verify_signed != nullptr && auth_.is_signed(token)) {
    return auth_.verify_signed(token, job);
  }
  if (auto it = auth_.fixed_tokens.find(job); it != auth_.fixed_tokens.end()) {
    if (!SameSecret(it->second, token)) {
      return absl::PermissionDeniedError(
          absl::StrCat("wrong token for job ", job, " (it does not match --job_tokens)"));
    }
    return absl::OkStatus();
  }
  if (auth_.first_session_sets_token) {
    *first_session_rule = true;
    return absl::OkStatus();
  }
  if (!accepts_anyone()) {
    return absl::PermissionDeniedError(
        "this railyardd authenticates no client: start it with --token_key_file (signed job "
        "tokens), --job_tokens, or, for demos only, --insecure_first_session_token");
  }
  if (auth_.verify_signed != nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "job ", job, " needs a signed token (railctl token issue, passed as RAILYARD_TOKEN)",
        token.empty() ? ": none was given" : ": the one given is not a signed token"));
  }
  return absl::PermissionDeniedError(
      absl::StrCat("job ", job, " is not listed in this daemon's --job_tokens file"));
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Open(const std::string& job_id,
                                                               const std::string& token,
                                                               const PeerCred& cred,
                                                               const std::string& client) {
  if (!ValidJobId(job_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id '", job_id.substr(0, 64), "' is not [A-Za-z0-9._-]{1,128}"));
  }
  if (absl::Status s = auth_.policy.Check(job_id, cred); !s.ok()) return s;
  bool first_session_rule = false;
  if (absl::Status s = CheckToken(job_id, token, &first_session_rule); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("railyardd is shutting down");
  if (limits_->max_sessions != 0 && sessions_.size() >= limits_->max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat("this railyardd serves its limit of ",
                                                     limits_->max_sessions,
                                                     " sessions (--max_sessions)"));
  }
  auto job_it = jobs_.find(job_id);
  if (job_it != jobs_.end()) {
    Job& job = job_it->second;
    if (first_session_rule && !SameSecret(job.token, token)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "wrong token for job ", job_id, ": it does not match the token its first session set"));
    }
    if (limits_->max_sessions_per_job != 0 &&
        static_cast<uint64_t>(job.sessions) >= limits_->max_sessions_per_job) {
      return absl::ResourceExhaustedError(
          absl::StrCat("job ", job_id, " has its limit of ", limits_->max_sessions_per_job,
                       " sessions on this node (--max_sessions_per_job)"));
    }
  } else {
    job_it = jobs_.emplace(job_id, Job{}).first;
    job_it->second.usage = std::make_shared<JobUsage>(job_id);
    if (first_session_rule) job_it->second.token = token;
  }
  Job& job = job_it->second;
  ++job.sessions;
  auto session =
      std::make_shared<Session>(RandomHex128(), job_id, cred.pid, client.substr(0, 128),
                                std::make_shared<QuotaAccount>(limits_, job.usage), cred);
  sessions_.emplace(session->id(), session);
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Find(
    const std::string& session_id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError("unknown session id: connect first (or the session has ended)");
  }
  return it->second;
}

bool SessionRegistry::Remove(const std::shared_ptr<Session>& session) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session->id());
  if (it == sessions_.end() || it->second != session) return false;
  sessions_.erase(it);
  auto job = jobs_.find(session->job());
  if (job != jobs_.end() && --job->second.sessions == 0) jobs_.erase(job);
  return true;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  std::vector<std::shared_ptr<Session>> out;
  for (const auto& [id, s] : sessions_) out.push_back(s);
  return out;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> out;
  for (const auto& [id, s] : sessions_) out.push_back(s);
  return out;
}

size_t SessionRegistry::jobs() const {
  absl::MutexLock lock(&mu_);
  return jobs_.size();
}

}  // namespace railyard
