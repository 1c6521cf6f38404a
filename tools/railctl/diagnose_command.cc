#include "tools/railctl/diagnose_command.h"

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/railctl/admin_client.h"
#include "tools/railctl/command.h"
#include "tools/railctl/text_table.h"

namespace railyard::railctl {
namespace {

constexpr char kUsage[] =
    "Usage: railctl diagnose [COMM_ID | --job J] [--timeout_ms MS] [--stall_ms MS]\n"
    "                        [--socket S] [--admin_socket A] [--json]\n"
    "Which rank, node or link a communicator waits for. The daemon at S gathers every member\n"
    "daemon's view of the communicator (or of every communicator of job J on it) within\n"
    "--timeout_ms (default 2000, at most 30000; a daemon that does not answer is itself a\n"
    "finding) and judges them: a rank that has not submitted, nodes that disagree on an\n"
    "operation, a transfer that does not complete. Something pending for less than --stall_ms\n"
    "(default 1000) is not a finding. Prints the verdicts first, then the evidence. Exit 0 when\n"
    "healthy, 1 when a problem was found (or the daemon could not be asked), 2 for bad\n"
    "arguments.\n";

absl::StatusOr<uint32_t> Millis(const std::string& flag, const std::string& value, uint32_t max) {
  uint32_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v == 0 || v > max) {
    return UsageError(absl::StrCat(flag, " '", value, "' is not a duration in ms (1..", max, ")"));
  }
  return v;
}

std::string Age(double s) { return absl::StrFormat("%.1f s", s); }

}  // namespace

std::string FormatDiagnosis(const v1::CommDiagnosis& d) {
  std::string out = absl::StrCat("communicator ", d.comm_id(), " (job ", d.job_id(),
                                 "): ", d.healthy() ? "healthy" : "PROBLEM", "\n");
  for (const std::string& v : d.verdicts()) absl::StrAppend(&out, "  * ", v, "\n");
  absl::StrAppend(&out, "\nevidence:\n");
  TextTable ranks({"NODE", "RANK", "PID", "SUBMITTED", "COMPLETED", "STATE"});
  TextTable ops({"NODE", "SEQ", "OP", "AGE", "SUBMITTED", "MISSING", "RUNNING", "STEPS"});
  TextTable transfers({"NODE", "STEP", "DIR", "PEER", "RAIL", "BYTES", "AGE"});
  for (const v1::CommState& st : d.states()) {
    for (const v1::RankProgress& r : st.ranks()) {
      ranks.AddRow({st.node_name(), absl::StrCat(r.rank()),
                    r.pid() > 0 ? absl::StrCat(r.pid()) : "-", absl::StrCat(r.submitted()),
                    absl::StrCat(r.completed()), r.left() ? "left" : st.state()});
    }
    for (const v1::OpProgress* op :
         {st.has_front() ? &st.front() : nullptr, st.has_failed_op() ? &st.failed_op() : nullptr}) {
      if (op == nullptr) continue;
      ops.AddRow(
          {st.node_name(), absl::StrCat(op->seq(), op == &st.failed_op() ? " (failed)" : ""),
           absl::StrCat(op->op(), " ", op->dtype(), " x", op->count()), Age(op->age_seconds()),
           absl::StrJoin(op->submitted_ranks(), ","), absl::StrJoin(op->missing_ranks(), ","),
           op->running() ? "yes" : "no",
           op->steps_total() > 0 ? absl::StrCat(op->steps_done(), "/", op->steps_total()) : "-"});
      for (const v1::TransferProgress& t : op->transfers()) {
        transfers.AddRow({st.node_name(), absl::StrCat(t.step()),
                          t.send() ? "send to" : "recv from", t.peer_name(),
                          absl::StrCat("rail", t.rail()), FormatBytes(t.bytes()),
                          Age(t.age_seconds())});
      }
    }
    if (!st.error().empty()) absl::StrAppend(&out, "  ", st.node_name(), ": ", st.error(), "\n");
  }
  for (const std::string& u : d.unreachable()) absl::StrAppend(&out, "  no answer: ", u, "\n");
  if (!ranks.empty()) out += ranks.Render();
  if (!ops.empty()) out += "\n" + ops.Render();
  if (!transfers.empty()) out += "\n" + transfers.Render();
  return out;
}

absl::Status RunDiagnose(const std::vector<std::string>& args) {
  v1::DiagnoseRequest req;
  std::vector<std::string> common;
  std::string comm_id;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& flag) -> absl::StatusOr<std::string> {
      if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
      if (i + 1 >= args.size()) return UsageError(absl::StrCat(flag, " needs a value"));
      return args[++i];
    };
    auto is = [&](const std::string& flag) { return a == flag || a.rfind(flag + "=", 0) == 0; };
    if (is("--job")) {
      absl::StatusOr<std::string> v = value("--job");
      if (!v.ok()) return v.status();
      req.set_job_id(*v);
    } else if (is("--timeout_ms") || is("--stall_ms")) {
      const std::string flag = is("--timeout_ms") ? "--timeout_ms" : "--stall_ms";
      absl::StatusOr<std::string> v = value(flag);
      if (!v.ok()) return v.status();
      // The daemon waits for its peers at most 30 s; a stall threshold may be up to an hour.
      absl::StatusOr<uint32_t> ms = Millis(flag, *v, flag == "--timeout_ms" ? 30'000 : 3'600'000);
      if (!ms.ok()) return ms.status();
      if (flag == "--timeout_ms") {
        req.set_timeout_ms(*ms);
      } else {
        req.set_stall_ms(*ms);
      }
    } else if (!a.empty() && a[0] == '-') {
      common.push_back(a);
      if ((a == "--socket" || a == "--admin_socket") && i + 1 < args.size()) {
        common.push_back(args[++i]);
      }
    } else if (comm_id.empty()) {
      comm_id = a;
    } else {
      return UsageError(absl::StrCat("unexpected argument '", a, "' (one COMM_ID at most)"));
    }
  }
  absl::StatusOr<CommonFlags> flags = ParseCommonFlags(common);
  if (!flags.ok()) return AsUsageError(flags.status());
  if (flags->help) {
    std::fputs(kUsage, stdout);
    return absl::OkStatus();
  }
  if (comm_id.empty() == req.job_id().empty()) {
    return UsageError("name a communicator (COMM_ID) or a job (--job J), not both");
  }
  req.set_comm_id(comm_id);
  absl::StatusOr<v1::DiagnoseResponse> r =
      AdminClient(flags->socket, flags->admin_socket).Diagnose(req);
  if (!r.ok()) return r.status();
  int problems = 0;
  std::string first;  // the first unhealthy communicator's first verdict
  for (const v1::CommDiagnosis& d : r->comms()) {
    if (d.healthy()) continue;
    if (problems++ == 0 && d.verdicts_size() > 0) first = d.verdicts(0);
  }
  if (flags->json) {
    if (absl::Status printed = PrintJson(*r); !printed.ok()) return printed;
  } else {
    for (int i = 0; i < r->comms_size(); ++i) {
      if (i > 0) std::fputs("\n", stdout);
      std::fputs(FormatDiagnosis(r->comms(i)).c_str(), stdout);
    }
  }
  std::fflush(stdout);
  if (problems == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(problems, " of ", r->comms_size(), " communicators not healthy: ", first));
}

}  // namespace railyard::railctl
