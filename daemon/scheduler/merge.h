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

  // Forgets everything; ready for a new sequence number of a comm of nranks ranks.
  void Reset(int nranks);

  // Adds rank's request. INVALID_ARGUMENT naming both ranks and the field when it disagrees with
  // an earlier rank's, FAILED_PRECONDITION when rank already submitted this sequence number.
  // A disagreeing request is not added.
  absl::Status Add(int rank, const RankRequest* req);

  bool complete() const { return arrived_ == nranks_; }
  int arrived() const { return arrived_; }
  int nranks() const { return nranks_; }
  // Ranks that have not submitted yet, ascending.
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
};

// INVALID_ARGUMENT naming the first field where b (from rank_b) disagrees with a (rank_a).
absl::Status CheckAgreement(const RankRequest& a, int rank_a, const RankRequest& b, int rank_b);

}  // namespace railyard::scheduler
