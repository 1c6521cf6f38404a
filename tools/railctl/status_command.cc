#include "tools/railctl/status_command.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/railctl/admin_client.h"
#include "tools/railctl/command.h"
#include "tools/railctl/text_table.h"

namespace railyard::railctl {

std::string FormatStatus(const v1::StatusResponse& s) {
  std::string out = absl::StrFormat(
      "railyardd %s (data plane %d) on %s, socket %s, up %s, %d worker threads\n"
      "buffers %d (%s), operations %d completed, %d failed\n",
      s.version(), s.data_plane_version(), s.node_name(), s.socket(),
      FormatDuration(s.uptime_seconds()), s.worker_threads(), s.buffers(),
      FormatBytes(s.buffer_bytes()), s.ops_completed(), s.ops_failed());
  if (!s.devices().empty()) absl::StrAppend(&out, "devices: ", s.devices(), "\n");
  if (s.ops_held_for_streams() > 0) {
    absl::StrAppend(
        &out, "operations waiting for their streams or staging: ", s.ops_held_for_streams(), "\n");
  }
  if (!s.peer_address().empty()) {
    absl::StrAppend(&out, "peer service ", s.peer_address(), ", rails ",
                    absl::StrJoin(s.rails(), ", "), "\n");
  }

  TextTable jobs({"JOB", "WEIGHT", "SESSIONS", "COMMS", "BUFFERS", "BYTES"});
  for (const v1::JobStatus& j : s.jobs()) {
    jobs.AddRow({j.job_id(), absl::StrFormat("%g", j.weight()), absl::StrCat(j.sessions()),
                 absl::StrCat(j.comms()), absl::StrCat(j.buffers()),
                 FormatBytes(j.buffer_bytes())});
  }
  TextTable comms({"COMM", "JOB", "NODES", "RANKS", "STATE", "OPS", "FAILED", "REDUCED", "ERROR"});
  for (const v1::CommStatus& c : s.comms()) {
    comms.AddRow({c.comm_id(), c.job_id(), absl::StrCat(c.nnodes()),
                  absl::StrCat(c.joined_ranks(), "/", c.nranks()), c.state(),
                  absl::StrCat(c.ops_completed()), absl::StrCat(c.ops_failed()),
                  FormatBytes(c.bytes_reduced()), c.error().empty() ? "-" : c.error()});
  }
  TextTable sessions(
      {"SESSION", "JOB", "PID", "UID", "GID", "CLIENT", "PATH", "BUFFERS", "BYTES", "CONNECTED"});
  for (const v1::SessionStatus& x : s.sessions()) {
    sessions.AddRow({x.session_id_prefix(), x.job_id(), absl::StrCat(x.pid()),
                     absl::StrCat(x.uid()), absl::StrCat(x.gid()), x.client(),
                     x.rings() ? "rings" : "grpc", absl::StrCat(x.buffers()),
                     FormatBytes(x.buffer_bytes()), FormatDuration(x.connected_seconds())});
  }
  if (jobs.empty() && comms.empty() && sessions.empty()) {
    out += "no sessions\n";
    return out;
  }
  for (const TextTable* table : {&jobs, &comms, &sessions}) {
    if (table->empty()) continue;
    out += "\n";
    out += table->Render();
  }
  return out;
}

absl::Status RunStatus(const std::vector<std::string>& args) {
  absl::StatusOr<CommonFlags> flags = ParseCommonFlags(args);
  if (!flags.ok()) return flags.status();
  if (flags->help) {
    std::fputs(
        "Usage: railctl status [--socket S] [--admin_socket A] [--json]\n"
        "What the daemon at S (default $RAILYARD_SOCKET, else "
        "/run/railyard/railyard.sock) is doing:\nits jobs, communicators and "
        "sessions with their peers' pid/uid/gid. Asks the daemon's Admin socket A (default\n"
        "$RAILYARD_ADMIN_SOCKET, else S.admin). --json prints the Admin.Status reply as "
        "protobuf JSON.\n",
        stdout);
    return absl::OkStatus();
  }
  absl::StatusOr<v1::StatusResponse> status =
      AdminClient(flags->socket, flags->admin_socket).Status();
  if (!status.ok()) return status.status();
  if (flags->json) {
    if (absl::Status printed = PrintJson(*status); !printed.ok()) return printed;
  } else {
    std::fputs(FormatStatus(*status).c_str(), stdout);
  }
  return absl::OkStatus();
}

}  // namespace railyard::railctl
