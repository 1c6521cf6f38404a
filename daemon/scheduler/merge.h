// Merging the local ranks' submissions of one sequence number into one node-level operation.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "daemon/scheduler/op.h"

namespace railyard::scheduler {

// Collects the submissions of one sequence number of a communicator, one per rank, and checks
// that they describe the same collective. Not thread-safe: the communicator serialises access.
class OpMerge {
 public:
  explicit OpMerge(int nranks = 0) { Reset(nranks); }

  // Forgets everything; ready for a new sequence number of nranks submitters. labels[i] is the
  // rank number messages use for submitter i (the global rank of a local index); empty: i itself.
  void Reset(int nranks, const std::vector<int>* labels = nullptr);

  // Adds rank's request. INVALID_ARGUMENT naming both ranks and the field when it disagrees with
  // an earlier rank's, FAILED_PRECONDITION when rank already submitted this sequence number.
  // A disagreeing request is not added.
  absl::Status Add(int rank, const RankRequest* req);

  bool complete() const { return arrived_ == nranks_; }
  int arrived() const { return arrived_; }
  int nranks() const { return nranks_; }
  // Ranks (labels) that have not submitted yet, ascending.
  std::vector<int> MissingRanks() const;
  // The requests by rank; entries of missing ranks are null.
  const std::vector<const RankRequest*>& requests() const { return requests_; }

  // Checks what can only be checked once every rank is in: AllToAllv count symmetry
  // (rank j's send_counts[i] == rank i's recv_counts[j]). Requires complete().
  absl::Status CheckComplete() const;

 private:
  int nranks_ = 0;
  int arrived_ = 0;
  int first_rank_ = -1;
  std::vector<const RankRequest*> requests_;
  const std::vector<int>* labels_ = nullptr;
  int Label(int i) const { return labels_ == nullptr ? i : (*labels_)[i]; }
};

// INVALID_ARGUMENT naming the first field where b (from rank_b) disagrees with a (rank_a).
absl::Status CheckAgreement(const RankRequest& a, int rank_a, const RankRequest& b, int rank_b);

}  // namespace railyard::scheduler
