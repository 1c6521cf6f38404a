#include "daemon/core/tuning.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/cost_model_proto.h"
#include "daemon/scheduler/algorithms/algorithms.h"
#include "daemon/scheduler/compressed.h"
#include "daemon/scheduler/cost/compression.h"
#include "daemon/scheduler/cost/tuner.h"
#include "daemon/scheduler/op.h"
#include "daemon/util/log.h"

namespace railyard {

namespace cost = scheduler::cost;

Tuning::Tuning(std::string state_dir, CommRegistry* comms,
               std::function<void(const v1::CostModel&)> on_model)
    : state_dir_(std::move(state_dir)), comms_(comms), on_model_(std::move(on_model)) {}

void Tuning::LoadAtStart() {
  cost::Calibration c = cost::Calibration::Defaults();
  absl::StatusOr<cost::Calibration> loaded = cost::LoadCalibration(state_dir_);
  if (loaded.ok()) {
    c = *loaded;
    Log(LogLevel::kInfo, "cost", "calibration loaded",
        {F("dir", state_dir_), F("inter_alpha_s", c.inter.alpha_s),
         F("inter_beta", c.inter.beta_bytes_per_s), F("fitted_at", c.fitted_at)});
  } else if (loaded.status().code() != absl::StatusCode::kNotFound) {
    Log(LogLevel::kWarning, "cost", "calibration ignored, using defaults",
        {F("error", loaded.status().message())});
  }
  Use(ToProto(c));
}

void Tuning::Use(const v1::CostModel& model) {
  {
    absl::MutexLock lock(&mu_);
    model_ = model;
  }
  if (on_model_ != nullptr) on_model_(model);
}

v1::CostModel Tuning::CostModel() {
  absl::MutexLock lock(&mu_);
  return model_;
}

absl::StatusOr<std::string> Tuning::SetCalibration(const v1::CostModel& model) {
  cost::Calibration c = FromProto(model);
  if (c.source.empty()) c.source = "fit";
  if (absl::Status s = cost::Validate(c); !s.ok()) return s;
  std::error_code ec;
  std::filesystem::create_directories(state_dir_, ec);
  if (absl::Status s = cost::SaveCalibration(state_dir_, c); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(s.message(), " (--state_dir ", state_dir_, ")"));
  }
  Use(ToProto(c));
  Log(LogLevel::kInfo, "cost", "calibration stored",
      {F("dir", state_dir_), F("intra_alpha_s", c.intra.alpha_s),
       F("intra_beta", c.intra.beta_bytes_per_s), F("inter_alpha_s", c.inter.alpha_s),
       F("inter_beta", c.inter.beta_bytes_per_s)});
  return absl::StrCat(state_dir_, "/calibration.json");
}

absl::StatusOr<v1::ExplainResponse> Tuning::Explain(const v1::ExplainRequest& req) {
  scheduler::OpKind op;
  if (!scheduler::ParseOpName(req.op(), &op) || scheduler::IsPointToPoint(op) ||
      op == scheduler::OpKind::kAllToAllv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "op '", req.op(),
        "' is not one of allreduce, reducescatter, allgather, broadcast, reduce, alltoall, "
        "barrier"));
  }
  kernels::DataType dtype = kernels::DataType::kFloat32;
  if (!req.dtype().empty() && !kernels::ParseDataType(req.dtype(), &dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", req.dtype(), "'"));
  }
  std::shared_ptr<Communicator> comm;
  {
    std::vector<std::shared_ptr<Communicator>> multi;
    for (const auto& c : comms_->Snapshot()) {
      if (!req.comm_id().empty() && c->comm_id() != req.comm_id()) continue;
      if (req.comm_id().empty() && !c->multi_node()) continue;
      multi.push_back(c);
    }
    if (multi.empty()) {
      return absl::NotFoundError(
          req.comm_id().empty()
              ? "no multi-node communicator on this daemon (give --comm; railctl status lists them)"
              : absl::StrCat("no communicator ", req.comm_id(), " on this daemon"));
    }
    if (multi.size() > 1 && req.comm_id().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          multi.size(), " multi-node communicators on this daemon: name one with --comm"));
    }
    comm = multi[0];
  }
  if (comm->tuner() == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("communicator ", comm->comm_id(), " has no tuner"));
  }
  const int n = comm->nranks();
  scheduler::OpShape shape;
  shape.op = op;
  shape.dtype = dtype;
  shape.root = req.root();
  if (req.root() < 0 || req.root() >= n) {
    return absl::InvalidArgumentError(absl::StrCat("root ", req.root(), " not in [0, ", n, ")"));
  }
  shape.count =
      scheduler::CountForMessageBytes(op, dtype, static_cast<double>(req.size_bytes()), n);
  absl::StatusOr<std::shared_ptr<const cost::Choice>> chosen = comm->tuner()->Choose(shape);
  if (!chosen.ok()) return chosen.status();
  const cost::Choice* choice = chosen->get();
  v1::ExplainResponse out;
  out.set_comm_id(comm->comm_id());
  out.set_nranks(n);
  out.set_nnodes(comm->layout().nnodes);
  out.set_rails(comm->layout().rails);
  out.set_op(std::string(scheduler::OpName(op)));
  out.set_size_bytes(static_cast<uint64_t>(cost::PrimerBytes(shape, n)));
  for (const cost::Candidate& c : choice->candidates) {
    v1::ExplainCandidate* e = out.add_candidates();
    e->set_name(c.name);
    e->set_generator(c.generator);
    e->set_chunk_bytes(c.chunk_bytes);
    if (c.has_closed_form) {
      e->set_closed_form_s(c.closed_form.time_s());
      e->set_formula(c.closed_form.formula);
    }
    if (c.has_ir) e->set_ir_s(c.ir_time_s);
    e->set_note(c.note);
  }
  out.set_chosen(choice->algorithm);
  out.set_chosen_model(choice->model_name);
  out.set_chunk_bytes(choice->chunk_bytes);
  out.set_predicted_s(choice->predicted_s);
  out.set_reason(choice->reason);
  const auto& fabric = comm->tuner()->fabric();
  *out.mutable_cost_model() = CostModel();
  // The comm's own figures (from its coordinator) win over this daemon's current calibration.
  out.mutable_cost_model()->set_intra_alpha_s(fabric.intra.alpha_s);
  out.mutable_cost_model()->set_intra_beta_bytes_per_s(fabric.intra.beta_bytes_per_s);
  out.mutable_cost_model()->set_inter_alpha_s(fabric.inter.alpha_s);
  out.mutable_cost_model()->set_inter_beta_bytes_per_s(fabric.inter.beta_bytes_per_s);
  out.mutable_cost_model()->set_overhead_s(fabric.overhead_s);
  out.mutable_cost_model()->set_message_cpu_s(comm->tuner()->options().message_cpu_s);
  out.mutable_cost_model()->set_reduce_bytes_per_s(comm->tuner()->options().reduce_bytes_per_s);
  const std::string& forced = comm->forced_algorithm();
  if (OpPlanner::Forces(forced, op, comm->layout().nnodes == 1)) {
    out.set_forced(forced);
    out.set_chosen(forced);
    absl::StrAppend(out.mutable_reason(), "; but --algo/RAILYARD_ALGO forces ", forced);
  }
  if (!req.compression().empty() && req.compression() != "none") {
    std::vector<kernels::Codec> codecs;
    if (req.compression() == "auto") {
      codecs = cost::AutoCandidates();
    } else {
      absl::StatusOr<kernels::Codec> c = kernels::ParseCodec(req.compression());
      if (!c.ok()) return c.status();
      codecs = {*c};
    }
    if (scheduler::CompressionApplies(op, dtype, kernels::RedOp::kSum, comm->layout().nnodes)) {
      absl::StatusOr<cost::CompressionChoice> c = cost::ChooseCompression(
          *comm->tuner(), shape, comm->layout().nnodes, comm->layout().nranks, codecs);
      if (!c.ok()) return c.status();
      // A codec asked for by name runs whatever the model says; auto runs what pays.
      const bool named = req.compression() != "auto";
      out.set_compression(kernels::CodecName(named ? codecs[0] : c->codec));
      out.set_exact_s(c->exact_s);
      out.set_compressed_s(c->compressed_s);
      out.set_compression_reason(
          named ? absl::StrCat("asked for by name; the model says ", c->reason) : c->reason);
    }
  }
  return out;
}

}  // namespace railyard
