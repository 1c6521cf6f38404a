#include "daemon/session/quota.h"

#include "absl/strings/str_cat.h"

namespace railyard {
namespace {

struct ResourceInfo {
  const char* name;
  const char* session_flag;
  const char* job_flag;
  uint64_t session_default;
  uint64_t job_default;
};

constexpr uint64_t kGiB = uint64_t{1} << 30;

constexpr std::array<ResourceInfo, kResourceCount> kInfo = {{
    {"registered buffers", "max_buffers_per_session", "max_buffers_per_job", 4096, 16384},
    {"bytes of registered buffers", "max_buffer_bytes_per_session", "max_buffer_bytes_per_job",
     256 * kGiB, 1024 * kGiB},
    {"communicators", "max_comms_per_session", "max_comms_per_job", 1024, 4096},
    {"operations queued ahead of the slowest rank", "max_queued_ops_per_session",
     "max_queued_ops_per_job", 4096, 16384},
    {"point-to-point messages queued", "max_queued_p2p_per_session", "max_queued_p2p_per_job", 4096,
     16384},
    {"bytes of completion backlog", "max_completion_backlog_bytes_per_session",
     "max_completion_backlog_bytes_per_job", 16u << 20, 64u << 20},
    {"bytes of error-feedback residuals", "max_residual_bytes_per_session",
     "max_residual_bytes_per_job", 16 * kGiB, 32 * kGiB},
}};

const ResourceInfo& Info(Resource r) { return kInfo[static_cast<int>(r)]; }

absl::Status Exhausted(Resource r, const char* scope, uint64_t limit, uint64_t used, uint64_t n,
                       const char* flag) {
  // n == 0: a check before new work (CheckBelow), not a charge.
  return absl::ResourceExhaustedError(absl::StrCat(
      Info(r).name, " limit of this ", scope, " (", limit, ") reached: it holds ", used,
      n > 0 ? absl::StrCat(" and asked for ", n, " more") : std::string(), " (--", flag, ")"));
}

// Adds n to counter unless that passes limit (0: none); returns the value it saw when refusing.
bool TryAdd(std::atomic<uint64_t>& counter, uint64_t n, uint64_t limit, uint64_t* seen) {
  uint64_t cur = counter.load();
  while (true) {
    if (limit != 0 && (n > limit || cur > limit - n)) {
      *seen = cur;
      return false;
    }
    if (counter.compare_exchange_weak(cur, cur + n)) return true;
  }
}

}  // namespace

const char* ResourceName(Resource r) { return Info(r).name; }
const char* SessionFlag(Resource r) { return Info(r).session_flag; }
const char* JobFlag(Resource r) { return Info(r).job_flag; }

QuotaLimits QuotaLimits::Defaults() {
  QuotaLimits l;
  for (int i = 0; i < kResourceCount; ++i) {
    l.per_session[i] = kInfo[i].session_default;
    l.per_job[i] = kInfo[i].job_default;
  }
  return l;
}

absl::Status QuotaAccount::Charge(Resource r, uint64_t n, Enforce enforce) {
  if (n == 0) return absl::OkStatus();
  const int i = static_cast<int>(r);
  uint64_t seen = 0;
  if (!TryAdd(used_[i], n, limits_->per_session[i], &seen)) {
    return Exhausted(r, "session", limits_->per_session[i], seen, n, SessionFlag(r));
  }
  const uint64_t job_limit = enforce == Enforce::kSessionAndJob ? limits_->per_job[i] : 0;
  if (!TryAdd(job_->used_[i], n, job_limit, &seen)) {
    used_[i].fetch_sub(n);
    return Exhausted(r, "job", limits_->per_job[i], seen, n, JobFlag(r));
  }
  return absl::OkStatus();
}

void QuotaAccount::ChargePastLimit(Resource r, uint64_t n) {
  if (n == 0) return;
  const int i = static_cast<int>(r);
  used_[i].fetch_add(n);
  job_->used_[i].fetch_add(n);
}

void QuotaAccount::Release(Resource r, uint64_t n) {
  if (n == 0) return;
  const int i = static_cast<int>(r);
  used_[i].fetch_sub(n);
  job_->used_[i].fetch_sub(n);
}

absl::Status QuotaAccount::CheckBelow(Resource r) const {
  const int i = static_cast<int>(r);
  const uint64_t s = used_[i].load();
  if (limits_->per_session[i] != 0 && s >= limits_->per_session[i]) {
    return Exhausted(r, "session", limits_->per_session[i], s, 0, SessionFlag(r));
  }
  const uint64_t j = job_->used_[i].load();
  if (limits_->per_job[i] != 0 && j >= limits_->per_job[i]) {
    return Exhausted(r, "job", limits_->per_job[i], j, 0, JobFlag(r));
  }
  return absl::OkStatus();
}

absl::Status QuotaCharge::Take(std::shared_ptr<QuotaAccount> account, Resource r, uint64_t n,
                               QuotaCharge* out, Enforce enforce) {
  out->Reset();
  if (account == nullptr) return absl::OkStatus();  // not accounted (tests, peer-side work)
  if (absl::Status s = account->Charge(r, n, enforce); !s.ok()) return s;
  out->account_ = std::move(account);
  out->r_ = r;
  out->n_ = n;
  return absl::OkStatus();
}

QuotaCharge QuotaCharge::TakePastLimit(std::shared_ptr<QuotaAccount> account, Resource r,
                                       uint64_t n) {
  QuotaCharge out;
  if (account == nullptr || n == 0) return out;
  account->ChargePastLimit(r, n);
  out.account_ = std::move(account);
  out.r_ = r;
  out.n_ = n;
  return out;
}

QuotaCharge& QuotaCharge::operator=(QuotaCharge&& o) noexcept {
  if (this != &o) {
    Reset();
    account_ = std::move(o.account_);
    r_ = o.r_;
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}

void QuotaCharge::Reset() {
  if (account_ != nullptr) account_->Release(r_, n_);
  account_.reset();
  n_ = 0;
}

}  // namespace railyard
