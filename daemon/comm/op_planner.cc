#include "daemon/comm/op_planner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/scheduler/algorithms/algorithms.h"
#include "daemon/scheduler/compressed.h"
#include "daemon/scheduler/cost/compression.h"
#include "daemon/scheduler/node_executor.h"
#include "daemon/scheduler/tags.h"

namespace railyard {

using scheduler::OpKind;

OpPlanner::OpPlanner(scheduler::CommLayout layout, int my_node,
                     std::shared_ptr<scheduler::cost::Tuner> tuner, std::string default_algo,
                     size_t chunk_bytes, size_t max_chunk_bytes)
    : layout_(std::move(layout)),
      my_node_(my_node),
      tuner_(std::move(tuner)),
      default_algo_(std::move(default_algo)),
      chunk_bytes_(chunk_bytes),
      max_chunk_bytes_(max_chunk_bytes) {}

absl::StatusOr<std::shared_ptr<const scheduler::NodeSchedule>> OpPlanner::Project(
    const scheduler::RankSchedule& schedule, const scheduler::OpShape& shape,
    const std::string& algorithm, size_t chunk) const {
  auto projected = std::make_shared<const scheduler::NodeSchedule>(
      scheduler::Project(schedule, layout_, shape, my_node_));
  // A schedule must number its messages between two nodes within the tag's step field.
  const uint64_t max = scheduler::MaxStepTag(*projected);
  if (max >= scheduler::tags::kDigestStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", algorithm, " schedule in chunks of ", chunk, " bytes sends ", max + 1,
                     " messages between two nodes, more than the ", scheduler::tags::kDigestStep,
                     " a tag can number: split the operation into smaller ones"));
  }
  return projected;
}

bool OpPlanner::Forces(const std::string& algo, scheduler::OpKind op, bool one_node) {
  if (algo == scheduler::kAlgoLocal) return one_node;
  const auto* info = scheduler::algorithms::FindAlgorithm(algo);
  return info != nullptr && scheduler::algorithms::Implements(*info, op);
}

absl::StatusOr<PlannedOp> OpPlanner::Plan(
    const std::vector<const scheduler::RankRequest*>& requests) {
  const scheduler::RankRequest& r0 = *requests[0];
  scheduler::OpShape shape;
  shape.op = r0.op;
  shape.dtype = r0.dtype;
  shape.red_op = r0.red_op;
  shape.count = r0.count;
  shape.root = r0.root;
  const bool one_node = layout_.nnodes == 1;
  // A forced algorithm applies where it implements the op (like NCCL_ALGO); "local" runs only
  // on one node. Elsewhere the tuner picks.
  const std::string algo = !r0.algo.empty() ? r0.algo : default_algo_;
  const bool forced = Forces(algo, r0.op, one_node);
  // Compression (docs/compression.md) replaces the algorithm where it applies; elsewhere the
  // operation runs exact.
  if ((r0.codec_auto || r0.codec.kind != kernels::CodecKind::kNone) &&
      scheduler::CompressionApplies(r0.op, r0.dtype, r0.red_op, layout_.nnodes)) {
    if (!r0.codec_auto) return PlanCompressed(r0, r0.codec);
    if (tuner_ != nullptr) {
      const auto key = std::make_tuple(static_cast<int>(r0.op), static_cast<int>(r0.dtype),
                                       static_cast<int>(r0.red_op), r0.count);
      auto it = auto_choices_.find(key);
      if (it == auto_choices_.end()) {
        absl::StatusOr<scheduler::cost::CompressionChoice> decided =
            scheduler::cost::ChooseCompression(*tuner_, shape, layout_.nnodes, layout_.nranks,
                                               scheduler::cost::AutoCandidates());
        if (!decided.ok()) return decided.status();
        if (auto_choices_.size() >= 64) auto_choices_.clear();
        it = auto_choices_.emplace(key, *std::move(decided)).first;
      }
      const scheduler::cost::CompressionChoice* c = &it->second;
      if (c->codec.kind != kernels::CodecKind::kNone) {
        absl::StatusOr<PlannedOp> out = PlanCompressed(r0, c->codec);
        if (out.ok()) {
          out->exact_s = c->exact_s;
          out->compressed_s = c->compressed_s;
          out->predicted_s = c->compressed_s;
          out->compression_reason = c->reason;
        }
        return out;
      }
    }
  }
  if (r0.op == OpKind::kAllToAllv) {
    const bool direct = forced && algo == scheduler::kAlgoDirect;
    if (one_node && !direct) {
      PlannedOp out;
      out.algorithm = scheduler::kAlgoLocal;
      out.chunk_bytes = chunk_bytes_;
      out.forced = forced;
      return out;
    }
    return PlanAllToAllv(requests, std::move(shape), direct);
  }

  PlannedOp out;
  std::string chosen = one_node ? scheduler::kAlgoLocal : "";
  size_t chosen_chunk = chunk_bytes_;
  std::shared_ptr<const scheduler::cost::Choice> choice;
  if (tuner_ != nullptr) {
    absl::StatusOr<std::shared_ptr<const scheduler::cost::Choice>> c = tuner_->Choose(shape);
    if (c.ok()) {
      choice = *std::move(c);
      chosen = choice->algorithm;
      chosen_chunk = choice->chunk_bytes;
    } else if (!forced) {
      return c.status();
    }
  } else if (!one_node && !forced) {
    return absl::FailedPreconditionError("communicator has no tuner");
  }
  out.forced = forced;
  out.algorithm = forced ? algo : chosen;
  out.chunk_bytes = forced ? chunk_bytes_ : chosen_chunk;
  // Paced rails: no message longer than their slice (the chunk grows back while the schedule
  // would not fit the tag space, below).
  size_t uncapped_chunk = out.chunk_bytes;
  if (max_chunk_bytes_ > 0 && (out.chunk_bytes == 0 || out.chunk_bytes > max_chunk_bytes_)) {
    out.chunk_bytes = max_chunk_bytes_;
  }
  auto predict = [&](const std::string& name) {
    if (choice == nullptr) return -1.0;
    for (const scheduler::cost::Candidate& k : choice->candidates) {
      if (k.generator == name) return k.time_s() + choice->op_overhead_s;
    }
    return -1.0;
  };
  if (out.algorithm == scheduler::kAlgoLocal) {
    out.chunk_bytes = chunk_bytes_;  // the local plan's step size
    out.predicted_s = predict(out.algorithm);
    return out;
  }
  const std::string key = absl::StrCat(
      out.algorithm, "|", out.chunk_bytes, "|", static_cast<int>(r0.op), "|",
      static_cast<int>(r0.dtype), "|", static_cast<int>(r0.red_op), "|", r0.count, "|", r0.root);
  if (auto it = cache_.find(key); it != cache_.end()) {
    out.schedule = it->second.schedule;
    out.algorithm = it->second.algorithm;
    out.predicted_s = predict(out.algorithm);
    return out;
  }
  absl::StatusOr<scheduler::RankSchedule> schedule =
      scheduler::Generate(out.algorithm, shape, layout_, out.chunk_bytes);
  if (!schedule.ok() && forced && !chosen.empty() && chosen != out.algorithm) {
    // A forced algorithm that does not fit this layout (hier on uneven nodes): the tuner's.
    out.algorithm = chosen;
    out.chunk_bytes = chosen_chunk;
    if (max_chunk_bytes_ > 0 && (out.chunk_bytes == 0 || out.chunk_bytes > max_chunk_bytes_)) {
      out.chunk_bytes = max_chunk_bytes_;
    }
    out.forced = false;
    if (chosen == scheduler::kAlgoLocal) {
      out.chunk_bytes = chunk_bytes_;
      out.predicted_s = predict(chosen);
      return out;
    }
    uncapped_chunk = chosen_chunk;
    schedule = scheduler::Generate(chosen, shape, layout_, out.chunk_bytes);
  }
  if (!schedule.ok()) return schedule.status();
  const std::string ran = schedule->algorithm.empty() ? out.algorithm : schedule->algorithm;
  absl::StatusOr<std::shared_ptr<const scheduler::NodeSchedule>> projected =
      Project(*schedule, shape, ran, out.chunk_bytes);
  // A capped chunk that numbers too many messages: double it until the schedule fits (the
  // same on every member: they all cap alike).
  while (!projected.ok() && out.chunk_bytes != uncapped_chunk && out.chunk_bytes != 0 &&
         out.chunk_bytes < (size_t{1} << 40)) {
    out.chunk_bytes = uncapped_chunk != 0 && out.chunk_bytes * 2 >= uncapped_chunk
                          ? uncapped_chunk
                          : out.chunk_bytes * 2;
    schedule = scheduler::Generate(ran, shape, layout_, out.chunk_bytes);
    if (!schedule.ok()) return schedule.status();
    projected = Project(*schedule, shape, ran, out.chunk_bytes);
  }
  if (!projected.ok()) return projected.status();
  if (cache_.size() >= 64) cache_.clear();  // bounded; shapes repeat
  cache_[key] = {*projected, ran};
  out.schedule = *std::move(projected);
  out.algorithm = ran;
  out.predicted_s = predict(ran);
  return out;
}

absl::StatusOr<PlannedOp> OpPlanner::PlanCompressed(const scheduler::RankRequest& r0,
                                                    const kernels::Codec& codec) {
  PlannedOp out;
  out.algorithm = scheduler::kAlgoCompressed;
  out.codec = codec;
  // Units of the default chunk; on paced rails, small enough that their encoding fits the slice.
  size_t unit = chunk_bytes_;
  if (max_chunk_bytes_ > 0) {
    const double ratio = kernels::CompressionRatio(codec, 1 << 20);
    const auto cap = static_cast<size_t>(static_cast<double>(max_chunk_bytes_) * ratio);
    if (unit == 0 || unit > cap) unit = cap;
  }
  out.chunk_bytes = unit;
  const std::string key =
      absl::StrCat(out.algorithm, "|", kernels::CodecName(codec), "|", codec.topk_ratio, "|", unit,
                   "|", r0.count, "|", static_cast<int>(r0.dtype), "|", static_cast<int>(r0.op));
  if (auto it = cache_.find(key); it != cache_.end()) {
    out.schedule = it->second.schedule;
    return out;
  }
  absl::StatusOr<scheduler::NodeSchedule> schedule =
      r0.op == scheduler::OpKind::kReduceScatter
          ? scheduler::BuildCompressedReduceScatter(layout_, my_node_, r0.count, r0.dtype, codec,
                                                    unit)
          : scheduler::BuildCompressedAllReduce(layout_, my_node_, r0.count, r0.dtype, codec, unit);
  if (!schedule.ok()) return schedule.status();
  auto shared = std::make_shared<const scheduler::NodeSchedule>(*std::move(schedule));
  if (cache_.size() >= 64) cache_.clear();
  cache_[key] = {shared, out.algorithm};
  out.schedule = std::move(shared);
  return out;
}

absl::Status OpPlanner::CheckAllToAllvFits(int nranks) {
  const uint64_t n = nranks > 0 ? static_cast<uint64_t>(nranks) : 0;
  uint64_t bytes = 0;  // n < 2^31, so n * n fits; times 8 it may not
  const bool overflow = __builtin_mul_overflow(n * n, uint64_t{sizeof(uint64_t)}, &bytes);
  if (!overflow && bytes <= kMaxAllToAllvMatrixBytes) return absl::OkStatus();
  uint64_t max_ranks = 1;
  while ((max_ranks + 1) * (max_ranks + 1) * sizeof(uint64_t) <= kMaxAllToAllvMatrixBytes) {
    ++max_ranks;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "an alltoallv across nodes of ", n, " ranks is planned with ", n, " x ", n,
      " count and displacement matrices of ",
      overflow ? std::string("more than 2^64") : absl::StrCat(bytes), " bytes each, ",
      overflow ? std::string("far") : absl::StrCat(bytes - kMaxAllToAllvMatrixBytes, " bytes"),
      " past the ", kMaxAllToAllvMatrixBytes, "-byte bound (", max_ranks,
      " ranks at most): use alltoall, send/recv, or smaller communicators"));
}

absl::StatusOr<PlannedOp> OpPlanner::PlanAllToAllv(
    const std::vector<const scheduler::RankRequest*>& requests, scheduler::OpShape shape,
    bool forced_direct) {
  // Each daemon knows the rows (send counts) and columns (recv counts) of its own ranks: every
  // block to or from them. That is all the direct algorithm needs to derive this node's steps
  // and the same tags as its peers; blocks between two other nodes are left 0 here.
  if (absl::Status s = CheckAllToAllvFits(layout_.nranks); !s.ok()) return s;
  const size_t n = static_cast<size_t>(layout_.nranks);
  const std::vector<int>& local = layout_.ranks_of_node[my_node_];
  shape.a2av_counts.assign(n * n, 0);
  shape.a2av_send_displs.assign(n * n, 0);
  shape.a2av_recv_displs.assign(n * n, 0);
  for (size_t li = 0; li < local.size(); ++li) {
    const size_t g = static_cast<size_t>(local[li]);
    const scheduler::RankRequest& q = *requests[li];
    for (size_t j = 0; j < n; ++j) {
      shape.a2av_counts[g * n + j] = q.send_counts[j];
      shape.a2av_counts[j * n + g] = q.recv_counts[j];
      shape.a2av_send_displs[g * n + j] = q.send_displs[j];
      shape.a2av_recv_displs[g * n + j] = q.recv_displs[j];
    }
  }
  absl::StatusOr<scheduler::RankSchedule> schedule =
      scheduler::Generate(scheduler::kAlgoDirect, shape, layout_, chunk_bytes_);
  if (!schedule.ok()) return schedule.status();
  absl::StatusOr<std::shared_ptr<const scheduler::NodeSchedule>> projected =
      Project(*schedule, shape, scheduler::kAlgoDirect, chunk_bytes_);
  if (!projected.ok()) return projected.status();
  PlannedOp out;
  out.algorithm = scheduler::kAlgoDirect;
  out.chunk_bytes = chunk_bytes_;
  out.forced = forced_direct;
  out.schedule = *std::move(projected);
  return out;
}

}  // namespace railyard
