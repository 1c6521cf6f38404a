#include "daemon/scheduler/merge.h"

#include "absl/strings/str_cat.h"

namespace railyard::scheduler {

void OpMerge::Reset(int nranks, const std::vector<int>* labels) {
  labels_ = labels;
  nranks_ = nranks;
  arrived_ = 0;
  first_rank_ = -1;
  requests_.assign(static_cast<size_t>(nranks), nullptr);
}

absl::Status OpMerge::Add(int rank, const RankRequest* req) {
  if (rank < 0 || rank >= nranks_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " not in [0, ", nranks_, ")"));
  }
  if (requests_[rank] != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", Label(rank), " already submitted this sequence number"));
  }
  if (first_rank_ >= 0) {
    if (auto s = CheckAgreement(*requests_[first_rank_], Label(first_rank_), *req, Label(rank));
        !s.ok()) {
      return s;
    }
  } else {
    first_rank_ = rank;
  }
  requests_[rank] = req;
  ++arrived_;
  return absl::OkStatus();
}

std::vector<int> OpMerge::MissingRanks() const {
  std::vector<int> missing;
  for (int r = 0; r < nranks_; ++r) {
    if (requests_[r] == nullptr) missing.push_back(Label(r));
  }
  return missing;
}

absl::Status CheckAgreement(const RankRequest& a, int rank_a, const RankRequest& b, int rank_b) {
  auto mismatch = [&](absl::string_view field, const auto& va, const auto& vb) {
    return absl::InvalidArgumentError(absl::StrCat("ranks disagree on ", field, ": rank ", rank_a,
                                                   " submitted ", va, ", rank ", rank_b,
                                                   " submitted ", vb));
  };
  if (a.op != b.op) return mismatch("op", OpName(a.op), OpName(b.op));
  if (a.op == OpKind::kBarrier) return absl::OkStatus();
  // Ranks on different devices of the node meet through peer access (local_plan.h); host memory
  // and device memory do not mix in one operation.
  if ((a.device >= 0) != (b.device >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks disagree on where their buffers are: rank ", rank_a, " submitted ",
                     MemoryName(a.device), ", rank ", rank_b, " submitted ", MemoryName(b.device),
                     " (one operation's buffers must all be host memory or all device memory)"));
  }
  if (a.dtype != b.dtype) {
    return mismatch("dtype", std::string(kernels::Name(a.dtype)),
                    std::string(kernels::Name(b.dtype)));
  }
  if (a.op != OpKind::kAllToAllv && a.count != b.count) return mismatch("count", a.count, b.count);
  if (IsReduction(a.op) && a.red_op != b.red_op) {
    return mismatch("red_op", std::string(kernels::Name(a.red_op)),
                    std::string(kernels::Name(b.red_op)));
  }
  if ((a.op == OpKind::kBroadcast || a.op == OpKind::kReduce) && a.root != b.root) {
    return mismatch("root", a.root, b.root);
  }
  if (a.algo != b.algo) {
    return mismatch("algo (RAILYARD_ALGO)", a.algo.empty() ? "<daemon default>" : a.algo,
                    b.algo.empty() ? "<daemon default>" : b.algo);
  }
  // Compression applies to AllReduce only (elsewhere it is ignored, so it need not agree).
  if (a.op == OpKind::kAllReduce) {
    const std::string ca = a.codec_auto ? "auto" : kernels::CodecName(a.codec);
    const std::string cb = b.codec_auto ? "auto" : kernels::CodecName(b.codec);
    if (ca != cb) return mismatch("compression (RAILYARD_COMPRESSION)", ca, cb);
    if (a.error_feedback != b.error_feedback || a.feedback_key != b.feedback_key) {
      auto key = [](const RankRequest& r) {
        return r.error_feedback ? absl::StrCat("key ", r.feedback_key) : std::string("none");
      };
      return mismatch("compression_key (error feedback)", key(a), key(b));
    }
  }
  return absl::OkStatus();
}

absl::Status OpMerge::CheckComplete() const {
  if (nranks_ == 0 || requests_[0] == nullptr || requests_[0]->op != OpKind::kAllToAllv) {
    return absl::OkStatus();
  }
  for (int j = 0; j < nranks_; ++j) {
    for (int i = 0; i < nranks_; ++i) {
      // Counts are indexed by (global) rank: the label of a submitter.
      const uint64_t sent = requests_[j]->send_counts[Label(i)];
      const uint64_t expected = requests_[i]->recv_counts[Label(j)];
      if (sent != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            "alltoallv counts disagree: rank ", Label(j), " sends ", sent, " elements to rank ",
            Label(i), ", which expects ", expected, " from rank ", Label(j)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace railyard::scheduler
