#include "daemon/session/job_weights.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/session/job_tokens.h"
#include "daemon/util/config_lines.h"

namespace railyard {

absl::Status JobWeights::CheckWeight(double weight) {
  if (!std::isfinite(weight) || weight < kMin || weight > kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight ", weight, " is not a number in [", kMin, ", ", kMax, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, double>> JobWeights::Parse(absl::string_view content) {
  std::map<std::string, double> out;
  absl::Status parsed = ForEachConfigLine(content, [&](int lineno, absl::string_view line) {
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t\v\f\r"), absl::SkipEmpty());
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("job weights line ", lineno, ": expected '<job_id> <weight>'"));
    }
    if (!ValidJobId(parts[0])) {
      return absl::InvalidArgumentError(absl::StrCat("job weights line ", lineno, ": '", parts[0],
                                                     "' is not a job id ([A-Za-z0-9._-]{1,128})"));
    }
    double w = 0;
    if (!absl::SimpleAtod(parts[1], &w)) {
      return absl::InvalidArgumentError(
          absl::StrCat("job weights line ", lineno, ": '", parts[1], "' is not a number"));
    }
    if (absl::Status s = CheckWeight(w); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("job weights line ", lineno, ": ", s.message()));
    }
    if (!out.emplace(std::string(parts[0]), w).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("job weights line ", lineno, ": job ", parts[0], " listed twice"));
    }
    return absl::OkStatus();
  });
  if (!parsed.ok()) return parsed;
  return out;
}

absl::Status JobWeights::Load(const std::string& path, std::vector<std::string>* dropped) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job weights file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<std::map<std::string, double>> parsed = Parse(ss.str());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", parsed.status().message()));
  }
  absl::MutexLock l(&mu_);
  if (dropped != nullptr) {
    for (const auto& [job, e] : weights_) {
      if (e.source == "admin") dropped->push_back(job);
    }
  }
  weights_.clear();
  for (const auto& [job, w] : *parsed) weights_[job] = Entry{w, "file"};
  ++loads_;
  return absl::OkStatus();
}

absl::StatusOr<double> JobWeights::Set(const std::string& job, double weight) {
  if (!ValidJobId(job)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", job, "' is not a job id ([A-Za-z0-9._-]{1,128})"));
  }
  if (absl::Status s = CheckWeight(weight); !s.ok()) return s;
  absl::MutexLock l(&mu_);
  Entry& e = weights_[job];
  const double before = e.source.empty() ? kDefault : e.weight;
  e = Entry{weight, "admin"};
  return before;
}

double JobWeights::Get(const std::string& job) const {
  absl::ReaderMutexLock l(&mu_);
  auto it = weights_.find(job);
  return it == weights_.end() ? kDefault : it->second.weight;
}

std::map<std::string, JobWeights::Entry> JobWeights::Snapshot() const {
  absl::ReaderMutexLock l(&mu_);
  return weights_;
}

int JobWeights::loads() const {
  absl::ReaderMutexLock l(&mu_);
  return loads_;
}

}  // namespace railyard
