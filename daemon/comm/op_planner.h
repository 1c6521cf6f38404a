// The one path from a merged operation to what executes it, for one node and many: the forced
// algorithm (RAILYARD_ALGO, --algo) where it implements the op, else the communicator's tuner;
// then either the single-pass local plan (one node, algorithm "local") or the chosen algorithm's
// schedule projected on this node (cached by shape). The communicator runs what comes out; the
// metrics, railctl explain and the tuner all see the same algorithm name.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/scheduler/cost/compression.h"
#include "daemon/scheduler/cost/tuner.h"
#include "daemon/scheduler/op.h"
#include "daemon/scheduler/schedule.h"

namespace railyard {

struct PlannedOp {
  std::string algorithm;  // what runs: scheduler::kAlgoLocal or a schedule generator's name
  size_t chunk_bytes = 0;
  bool forced = false;      // by the request or --algo
  double predicted_s = -1;  // the cost model's prediction for what runs; < 0: none
  // Null for the local plan (the communicator lowers the requests with BuildLocalPlan).
  std::shared_ptr<const scheduler::NodeSchedule> schedule;
  // The compressed AllReduce (algorithm "compressed"): its codec; none otherwise.
  kernels::Codec codec;
  // compression=auto: what the tuner predicted (exact_s < 0: not asked).
  double exact_s = -1;
  double compressed_s = -1;
  std::string compression_reason;
  bool local() const { return schedule == nullptr; }
};

class OpPlanner {
 public:
  // tuner may be null (unit tests): the local plan on one node, the default chunk elsewhere.
  OpPlanner(scheduler::CommLayout layout, int my_node,
            std::shared_ptr<scheduler::cost::Tuner> tuner, std::string default_algo,
            size_t chunk_bytes, size_t max_chunk_bytes = 0);

  // requests: the merged collective's requests of this node's ranks, by local index, all
  // present and in agreement. Errors (no algorithm for the op, a schedule that does not fit the
  // tag space) are the same on every daemon of the communicator, since all plan from the same
  // inputs.
  absl::StatusOr<PlannedOp> Plan(const std::vector<const scheduler::RankRequest*>& requests);

  // True when algo (RAILYARD_ALGO, --algo) applies to op: it implements it ("local": on one node).
  static bool Forces(const std::string& algo, scheduler::OpKind op, bool one_node);

  // Across nodes an AllToAllv is planned from nranks x nranks count and displacement matrices
  // (8 bytes an entry, three of them) and a direct schedule of about 1.5 nranks^2 transfers.
  // INVALID_ARGUMENT, saying by how much, when one matrix would pass kMaxAllToAllvMatrixBytes
  // (64 MiB: 2896 ranks); the communicator refuses such a submit before queueing it.
  static constexpr uint64_t kMaxAllToAllvMatrixBytes = uint64_t{64} << 20;
  static absl::Status CheckAllToAllvFits(int nranks);

  const scheduler::CommLayout& layout() const { return layout_; }
  const std::shared_ptr<scheduler::cost::Tuner>& tuner() const { return tuner_; }
  const std::string& default_algo() const { return default_algo_; }
  size_t cached_schedules() const { return cache_.size(); }

 private:
  struct Cached {
    std::shared_ptr<const scheduler::NodeSchedule> schedule;
    std::string algorithm;
  };
  // AllToAllv: the direct schedule of the blocks to and from this node's ranks (not cached: the
  // count matrix changes from call to call).
  absl::StatusOr<PlannedOp> PlanAllToAllv(const std::vector<const scheduler::RankRequest*>& reqs,
                                          scheduler::OpShape shape, bool forced_direct);
  // A sum/avg AllReduce or ReduceScatter across nodes under codec (compressed.h), cached like the
  // rest.
  absl::StatusOr<PlannedOp> PlanCompressed(const scheduler::RankRequest& r0,
                                           const kernels::Codec& codec);
  absl::StatusOr<std::shared_ptr<const scheduler::NodeSchedule>> Project(
      const scheduler::RankSchedule& schedule, const scheduler::OpShape& shape,
      const std::string& algorithm, size_t chunk) const;

  const scheduler::CommLayout layout_;
  const int my_node_;
  const std::shared_ptr<scheduler::cost::Tuner> tuner_;
  const std::string default_algo_;
  const size_t chunk_bytes_;
  // Paced rails (MultiNodeEnv::max_chunk_bytes): chunks of multi-node schedules at most this,
  // doubled while the schedule would send more messages than a tag numbers; 0: no cap.
  const size_t max_chunk_bytes_;
  std::map<std::string, Cached> cache_;  // by algorithm, chunk and shape; bounded
  // compression=auto's decision by (op, dtype, red_op, count): the tuner never changes for a
  // communicator, so neither does the decision, which per operation costs two tuner look-ups and
  // the reason's formatting on the submission path (bench/results/compression-small-*.txt:
  // auto at 0.88x of none at 4 KiB, running the same path, before; 1.04x or better after).
  // Bounded like cache_.
  std::map<std::tuple<int, int, int, uint64_t>, scheduler::cost::CompressionChoice> auto_choices_;
};

}  // namespace railyard
