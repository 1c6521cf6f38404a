#include "tools/railctl/topo_command.h"

#include <chrono>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "daemon/topology/discovery.h"
#include "daemon/topology/topology_file.h"
#include "daemon/topology/topology_graph.h"
#include "tools/railctl/admin_client.h"
#include "tools/railctl/command.h"

namespace railyard::railctl {
namespace {

// How long `railctl topo` waits for a daemon before it falls back to discovery.
constexpr std::chrono::milliseconds kDaemonWait{2000};

constexpr char kUsage[] =
    "Usage: railctl topo [--json] [--socket S] [--discover [--sysroot DIR]] [--file F]\n"
    "This node's topology graph: GPUs, NICs and the rails on them, NUMA nodes and their CPUs,\n"
    "link classes. By default from the daemon at S (default $RAILYARD_SOCKET, else\n"
    "/run/railyard/railyard.sock): its --topology file merged with discovery; when no daemon\n"
    "answers within 2 s, from discovery (noted on stderr).\n"
    "  --discover      discovery on this machine (sysfs, procfs), without asking a daemon\n"
    "  --sysroot DIR   discover under DIR instead of / (DIR/sys, DIR/proc)\n"
    "  --file F        a topology file (docs/topology.md), including its fabric section\n"
    "  --json          the graph as JSON in the topology file schema\n";

struct TopoFlags {
  CommonFlags common;
  bool discover = false;
  std::string sysroot = "/";
  std::optional<std::string> file;
};

absl::StatusOr<TopoFlags> ParseTopoFlags(const std::vector<std::string>& args) {
  TopoFlags flags;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    // --name V or --name=V; nullopt when arg is not --name.
    auto value = [&](const std::string& name) -> absl::StatusOr<std::optional<std::string>> {
      if (arg == name) {
        if (i + 1 >= args.size()) return absl::InvalidArgumentError(name + " needs a value");
        return std::optional<std::string>(args[++i]);
      }
      if (arg.rfind(name + "=", 0) == 0) {
        return std::optional<std::string>(arg.substr(name.size() + 1));
      }
      return std::optional<std::string>();
    };
    if (arg == "--discover") {
      flags.discover = true;
      continue;
    }
    absl::StatusOr<std::optional<std::string>> file = value("--file");
    if (!file.ok()) return file.status();
    if (file->has_value()) {
      if ((*file)->empty()) return absl::InvalidArgumentError("--file is empty");
      flags.file = **file;
      continue;
    }
    absl::StatusOr<std::optional<std::string>> sysroot = value("--sysroot");
    if (!sysroot.ok()) return sysroot.status();
    if (sysroot->has_value()) {
      if ((*sysroot)->empty()) return absl::InvalidArgumentError("--sysroot is empty");
      flags.sysroot = **sysroot;
      flags.discover = true;
      continue;
    }
    rest.push_back(arg);
  }
  absl::StatusOr<CommonFlags> common = ParseCommonFlags(rest);
  if (!common.ok()) return common.status();
  flags.common = *common;
  if (flags.file.has_value() && flags.discover) {
    return absl::InvalidArgumentError("--file and --discover exclude each other");
  }
  return flags;
}

}  // namespace

absl::Status RunTopo(const std::vector<std::string>& args) {
  absl::StatusOr<TopoFlags> flags = ParseTopoFlags(args);
  if (!flags.ok()) return flags.status();
  if (flags->common.help) {
    std::fputs(kUsage, stdout);
    return absl::OkStatus();
  }
  absl::StatusOr<v1::NodeTopology> topo;
  if (flags->file.has_value()) {
    topo = topology::LoadTopology(*flags->file);
  } else if (flags->discover) {
    topo = topology::Discover(flags->sysroot);
  } else {
    topo = AdminClient(flags->common.socket, flags->common.admin_socket).GetTopology(kDaemonWait);
    if (!topo.ok() &&
        (absl::IsUnavailable(topo.status()) || absl::IsDeadlineExceeded(topo.status()))) {
      std::fprintf(stderr, "railctl: topo: no daemon answered at %s; showing discovery\n",
                   flags->common.socket.c_str());
      topo = topology::Discover(flags->sysroot);
    }
  }
  if (!topo.ok()) return topo.status();
  absl::StatusOr<topology::TopologyGraph> graph = topology::TopologyGraph::FromProto(*topo);
  if (!graph.ok()) return graph.status();
  if (flags->common.json) {
    std::printf("%s\n", graph->ToJson().c_str());
  } else {
    std::fputs(graph->ToText().c_str(), stdout);
  }
  return absl::OkStatus();
}

}  // namespace railyard::railctl
