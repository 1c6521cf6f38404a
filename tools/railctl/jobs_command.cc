#include "tools/railctl/jobs_command.h"

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/topology/units.h"
#include "tools/railctl/admin_client.h"
#include "tools/railctl/command.h"
#include "tools/railctl/text_table.h"

namespace railyard::railctl {
namespace {

constexpr char kUsage[] =
    "Usage: railctl jobs [--socket S] [--admin_socket A] [--json]\n"
    "       railctl jobs set-weight JOB WEIGHT [--socket S] [--admin_socket A]\n"
    "Every job on the daemon at S with its weight on the paced rails' fair queues (source:\n"
    "default 1, the --job_weights file, or set-weight) and, per paced rail, the bytes it sent,\n"
    "its share of them and how long its sends waited. set-weight (0.01..1000) lasts until the\n"
    "daemon reloads --job_weights (SIGHUP). Asks the daemon's Admin socket A (default\n"
    "$RAILYARD_ADMIN_SOCKET, else S.admin).\n";

// Splits the positional words (set-weight JOB W) from the flags ParseCommonFlags takes.
void SplitArgs(const std::vector<std::string>& args, std::vector<std::string>* words,
               std::vector<std::string>* flags) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    // A word starting with '-' is a flag unless it is a number (a negative weight, refused later).
    if (a.size() > 1 && a[0] == '-' && !(a[1] >= '0' && a[1] <= '9') && a[1] != '.') {
      flags->push_back(a);
      if ((a == "--socket" || a == "--admin_socket") && i + 1 < args.size()) {
        flags->push_back(args[++i]);
      }
    } else {
      words->push_back(a);
    }
  }
}

}  // namespace

std::string FormatJobs(const v1::ListJobsResponse& r) {
  std::string out;
  TextTable rails({"RAIL", "PACE", "QUEUED", "SENDS QUEUED"});
  std::map<std::string, uint64_t> rail_total;
  for (const v1::JobShare& j : r.jobs()) {
    for (const v1::JobRailShare& s : j.rails()) rail_total[s.rail()] += s.bytes_sent();
  }
  for (const v1::RailPacing& p : r.rails()) {
    rails.AddRow({p.rail(),
                  p.pace_bytes_per_second() > 0
                      ? topology::FormatBandwidth(p.pace_bytes_per_second())
                      : "unpaced",
                  FormatBytes(p.queued_bytes()), absl::StrCat(p.queued_sends())});
  }
  if (!rails.empty()) out += rails.Render();
  if (!r.weights_file().empty()) {
    absl::StrAppend(&out, "weights file ", r.weights_file(), " (loaded ", r.weights_loads(),
                    " times)\n");
  }
  TextTable jobs({"JOB", "WEIGHT", "SOURCE", "SESSIONS", "COMMS", "RAIL", "SENT", "SHARE", "SENDS",
                  "WAIT AVG", "WAIT MAX"});
  for (const v1::JobShare& j : r.jobs()) {
    const std::vector<std::string> head = {j.job_id(), absl::StrFormat("%g", j.weight()),
                                           j.weight_source(), absl::StrCat(j.sessions()),
                                           absl::StrCat(j.comms())};
    if (j.rails().empty()) {
      std::vector<std::string> row = head;
      for (int i = 0; i < 6; ++i) row.push_back("-");
      jobs.AddRow(row);
      continue;
    }
    for (const v1::JobRailShare& s : j.rails()) {
      std::vector<std::string> row = head;
      const uint64_t total = rail_total[s.rail()];
      row.push_back(s.rail());
      row.push_back(FormatBytes(s.bytes_sent()));
      row.push_back(total > 0
                        ? absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(s.bytes_sent()) /
                                                        static_cast<double>(total))
                        : "-");
      row.push_back(absl::StrCat(s.sends()));
      row.push_back(s.sends() > 0 ? topology::FormatDuration(s.queue_delay_seconds_total() /
                                                             static_cast<double>(s.sends()))
                                  : "-");
      row.push_back(topology::FormatDuration(s.queue_delay_seconds_max()));
      jobs.AddRow(row);
    }
  }
  if (jobs.empty()) {
    out += "no jobs\n";
  } else {
    if (!out.empty()) out += "\n";
    out += jobs.Render();
  }
  return out;
}

absl::Status RunJobs(const std::vector<std::string>& args) {
  std::vector<std::string> words, flag_args;
  SplitArgs(args, &words, &flag_args);
  absl::StatusOr<CommonFlags> flags = ParseCommonFlags(flag_args);
  if (!flags.ok()) return AsUsageError(flags.status());
  if (flags->help) {
    std::fputs(kUsage, stdout);
    return absl::OkStatus();
  }
  AdminClient admin(flags->socket, flags->admin_socket);
  if (words.empty()) {
    absl::StatusOr<v1::ListJobsResponse> r = admin.ListJobs();
    if (!r.ok()) return r.status();
    if (flags->json) return PrintJson(*r);
    std::fputs(FormatJobs(*r).c_str(), stdout);
    return absl::OkStatus();
  }
  if (words[0] != "set-weight") {
    return UsageError(absl::StrCat("unknown jobs subcommand '", words[0],
                                   "' (expected set-weight, or none to list)"));
  }
  if (words.size() != 3) return UsageError("set-weight needs JOB and WEIGHT");
  double weight = 0;
  if (!absl::SimpleAtod(words[2], &weight)) {
    return UsageError(absl::StrCat("weight '", words[2], "' is not a number"));
  }
  absl::StatusOr<double> previous = admin.SetJobWeight(words[1], weight);
  if (!previous.ok()) return previous.status();
  if (flags->json) {
    v1::SetJobWeightResponse resp;
    resp.set_previous_weight(*previous);
    return PrintJson(resp);
  }
  std::printf("job %s: weight %g (was %g)\n", words[1].c_str(), weight, *previous);
  return absl::OkStatus();
}

}  // namespace railyard::railctl
