#include "daemon/session/session_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/comm/comm_id.h"
#include "daemon/session/job_tokens.h"

namespace railyard {

SessionRegistry::SessionRegistry(std::map<std::string, std::string> fixed_tokens)
    : fixed_tokens_(std::move(fixed_tokens)) {}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Open(const std::string& job_id,
                                                               const std::string& token,
                                                               int64_t pid,
                                                               const std::string& client) {
  if (!ValidJobId(job_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id '", job_id.substr(0, 64), "' is not [A-Za-z0-9._-]{1,128}"));
  }
  if (!fixed_tokens_.empty()) {
    auto it = fixed_tokens_.find(job_id);
    if (it == fixed_tokens_.end()) {
      return absl::PermissionDeniedError(
          absl::StrCat("job ", job_id, " is not listed in this daemon's job tokens file"));
    }
    if (it->second != token) {
      return absl::PermissionDeniedError(absl::StrCat("wrong token for job ", job_id));
    }
  }
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("railyardd is shutting down");
  auto [job_it, inserted] = jobs_.try_emplace(job_id);
  Job& job = job_it->second;
  if (inserted) {
    job.token = token;
  } else if (job.token != token) {
    return absl::PermissionDeniedError(absl::StrCat(
        "wrong token for job ", job_id, ": it does not match the token its first session set"));
  }
  ++job.sessions;
  auto session = std::make_shared<Session>(RandomHex128(), job_id, pid, client.substr(0, 128));
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
