#include "tools/railctl/explain_command.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/topology/units.h"
#include "tools/railctl/admin_client.h"
#include "tools/railctl/command.h"
#include "tools/railctl/flag_set.h"
#include "tools/railctl/text_table.h"

namespace railyard::railctl {
namespace {

constexpr const char* kUsage =
    "usage: railctl explain OP SIZE [--comm ID] [--dtype T] [--root R] [--compression C]\n"
    "                       [--socket S] [--json]\n"
    "OP: allreduce reducescatter allgather broadcast reduce alltoall barrier; SIZE as in\n"
    "railctl model (PRIMER's M). --comm: a communicator id from railctl status (default: the\n"
    "daemon's only multi-node communicator). --compression (allreduce, reducescatter): auto\n"
    "or a codec (fp16, bf16, int8, topk:R): whether it pays, with both predictions.\n";

nlohmann::json CostModelJson(const v1::CostModel& m) {
  return {{"intra_alpha_s", m.intra_alpha_s()},
          {"intra_beta_bytes_per_s", m.intra_beta_bytes_per_s()},
          {"inter_alpha_s", m.inter_alpha_s()},
          {"inter_beta_bytes_per_s", m.inter_beta_bytes_per_s()},
          {"overhead_s", m.overhead_s()},
          {"message_cpu_s", m.message_cpu_s()},
          {"reduce_bytes_per_s", m.reduce_bytes_per_s()},
          {"source", m.source()},
          {"op", m.op()},
          {"algorithm", m.algorithm()},
          {"placement", m.placement()},
          {"fitted_at", m.fitted_at()},
          {"nranks", m.nranks()},
          {"nnodes", m.nnodes()},
          {"samples", m.samples()},
          {"rms_relative_error", m.rms_relative_error()}};
}

}  // namespace

std::string DescribeCostModel(const v1::CostModel& m) {
  std::string out = absl::StrCat(
      "intra ", topology::FormatDuration(m.intra_alpha_s()), " + n / ",
      topology::FormatBandwidth(m.intra_beta_bytes_per_s()), "; inter ",
      topology::FormatDuration(m.inter_alpha_s()), " + n / ",
      topology::FormatBandwidth(m.inter_beta_bytes_per_s()), " per rail; overhead ",
      topology::FormatDuration(m.overhead_s()), " per message",
      m.message_cpu_s() > 0 ? absl::StrCat("; ", topology::FormatDuration(m.message_cpu_s()),
                                           " CPU per inter-node message at each end")
                            : std::string(),
      m.reduce_bytes_per_s() > 0
          ? absl::StrCat("; reductions at ", topology::FormatBandwidth(m.reduce_bytes_per_s()))
          : std::string(),
      m.op_overhead_s() > 0 ? absl::StrCat("; ", topology::FormatDuration(m.op_overhead_s()),
                                           " per operation (submission)")
                            : std::string());
  if (m.source() == "fit") {
    absl::StrAppend(&out, "\n  fitted ", m.fitted_at(), " on ", m.op(), "/", m.algorithm(), ", ",
                    m.nranks(), " ranks on ", m.nnodes(), " nodes (", m.placement(), "), ",
                    m.samples(), " sizes, rms error ",
                    absl::StrFormat("%.1f%%", 100 * m.rms_relative_error()));
  } else {
    absl::StrAppend(&out, " (built-in defaults: run railctl calibrate)");
  }
  return out;
}

absl::Status RunExplain(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedFlags> f = ParseFlags(
      args, {"comm", "dtype", "root", "compression", "socket", "admin_socket"}, {"json"});
  if (!f.ok()) return f.status();
  if (f->Bool("help")) {
    std::fputs(kUsage, stdout);
    return absl::OkStatus();
  }
  if (f->positional.empty()) return absl::InvalidArgumentError("missing OP (try --help)");
  v1::ExplainRequest req;
  req.set_op(f->positional[0]);
  if (f->positional[0] != "barrier") {
    if (f->positional.size() < 2) return absl::InvalidArgumentError("missing SIZE (try --help)");
    absl::StatusOr<double> size = topology::ParseBytes(f->positional[1]);
    if (!size.ok()) return size.status();
    req.set_size_bytes(static_cast<uint64_t>(*size));
  }
  if (f->positional.size() > (f->positional[0] == "barrier" ? 1u : 2u)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", f->positional.back(), "'"));
  }
  req.set_comm_id(f->Get("comm"));
  req.set_dtype(f->Get("dtype"));
  absl::StatusOr<int> root = IntFlag(*f, "root", 0, 0);
  if (!root.ok()) return root.status();
  req.set_root(*root);
  req.set_compression(f->Get("compression"));
  AdminClient client(f->Get("socket", DefaultSocket()), f->Get("admin_socket", ""));
  absl::StatusOr<v1::ExplainResponse> r = client.Explain(req);
  if (!r.ok()) return r.status();
  if (f->Bool("json")) {
    nlohmann::json candidates = nlohmann::json::array();
    for (const v1::ExplainCandidate& c : r->candidates()) {
      nlohmann::json j = {
          {"name", c.name()}, {"generator", c.generator()}, {"chunk_bytes", c.chunk_bytes()}};
      if (c.closed_form_s() > 0) j["closed_form_s"] = c.closed_form_s();
      if (c.ir_s() > 0) j["ir_s"] = c.ir_s();
      if (!c.note().empty()) j["note"] = c.note();
      candidates.push_back(j);
    }
    nlohmann::json out = {{"comm_id", r->comm_id()},
                          {"op", r->op()},
                          {"size_bytes", r->size_bytes()},
                          {"nranks", r->nranks()},
                          {"nnodes", r->nnodes()},
                          {"rails", r->rails()},
                          {"candidates", candidates},
                          {"chosen", r->chosen()},
                          {"chosen_model", r->chosen_model()},
                          {"chunk_bytes", r->chunk_bytes()},
                          {"predicted_s", r->predicted_s()},
                          {"reason", r->reason()},
                          {"calibration", CostModelJson(r->cost_model())}};
    if (!r->forced().empty()) out["forced"] = r->forced();
    if (!r->compression().empty()) {
      out["compression"] = {{"codec", r->compression()},
                            {"exact_s", r->exact_s()},
                            {"compressed_s", r->compressed_s()},
                            {"reason", r->compression_reason()}};
    }
    std::printf("%s\n", out.dump(2).c_str());
    return absl::OkStatus();
  }
  std::printf("%s of %s on communicator %s: %d ranks on %d nodes, %d rails\n", r->op().c_str(),
              topology::FormatBytes(static_cast<double>(r->size_bytes())).c_str(),
              r->comm_id().c_str(), r->nranks(), r->nnodes(), r->rails());
  TextTable table({"CANDIDATE", "RUNS AS", "CHUNK", "SCHEDULE IR", "CLOSED FORM", "NOTE"});
  for (const v1::ExplainCandidate& c : r->candidates()) {
    table.AddRow(
        {c.name() + (c.name() == r->chosen_model() ? " *" : ""),
         c.generator().empty() ? "-" : c.generator(),
         c.chunk_bytes() == 0 ? "-" : topology::FormatBytes(static_cast<double>(c.chunk_bytes())),
         c.ir_s() > 0 ? topology::FormatDuration(c.ir_s()) : "-",
         c.closed_form_s() > 0 ? topology::FormatDuration(c.closed_form_s()) : "-", c.note()});
  }
  std::fputs(table.Render().c_str(), stdout);
  const double op_overhead = r->cost_model().op_overhead_s();
  const std::string chunking =
      r->chunk_bytes() == 0
          ? std::string("unchunked")
          : absl::StrCat("chunks of ",
                         topology::FormatBytes(static_cast<double>(r->chunk_bytes())));
  std::printf(
      "chosen: %s (%s), predicted %s (%s schedule + %s per operation)\nwhy: %s\n"
      "calibration: %s\n",
      r->chosen().c_str(), chunking.c_str(), topology::FormatDuration(r->predicted_s()).c_str(),
      topology::FormatDuration(r->predicted_s() - op_overhead).c_str(),
      topology::FormatDuration(op_overhead).c_str(), r->reason().c_str(),
      DescribeCostModel(r->cost_model()).c_str());
  if (!r->compression().empty()) {
    std::printf("compression: %s (exact predicted %s, compressed %s): %s\n",
                r->compression().c_str(), topology::FormatDuration(r->exact_s()).c_str(),
                topology::FormatDuration(r->compressed_s()).c_str(),
                r->compression_reason().c_str());
  }
  return absl::OkStatus();
}

}  // namespace railyard::railctl
