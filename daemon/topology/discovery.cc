#include "daemon/topology/discovery.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/topology/topology_graph.h"

namespace railyard::topology {
namespace {

namespace fs = std::filesystem;

// The first line of a small sysfs/procfs file, trimmed; nullopt when unreadable (sysfs returns
// EINVAL for the speed of a NIC without a link).
std::optional<std::string> ReadLine(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  if (!std::getline(in, line)) return in.eof() ? std::optional<std::string>("") : std::nullopt;
  return std::string(absl::StripAsciiWhitespace(line));
}

std::optional<int> ReadInt(const fs::path& path) {
  std::optional<std::string> line = ReadLine(path);
  int v = 0;
  if (!line.has_value() || !absl::SimpleAtoi(*line, &v)) return std::nullopt;
  return v;
}

// Sorted names of a directory's entries; empty when it cannot be listed.
std::vector<std::string> List(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool Exists(const fs::path& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

// sysfs numa_node: -1 means the platform does not say.
void SetNuma(const fs::path& path, v1::Nic* nic) {
  std::optional<int> numa = ReadInt(path);
  if (numa.has_value() && *numa >= 0) nic->set_numa_node(*numa);
}

void DiscoverNetdevs(const fs::path& sys, v1::NodeTopology* out) {
  const fs::path net = sys / "class/net";
  for (const std::string& name : List(net)) {
    const fs::path dir = net / name;
    v1::Nic* nic = out->add_nics();
    nic->set_name(name);
    nic->set_state(ReadLine(dir / "operstate").value_or("unknown"));
    // Loopback, veth, bridges, tunnels, ifb: no device behind the interface.
    nic->set_is_virtual(!Exists(dir / "device"));
    std::optional<int> mbps = ReadInt(dir / "speed");
    if (mbps.has_value() && *mbps > 0) nic->set_speed_gbps(*mbps / 1000.0);
    SetNuma(dir / "device/numa_node", nic);
  }
}

// "400 Gb/sec (4X NDR)" -> 400; "2.5 Gb/sec (1X SDR)" -> 2.5; 0 when unreadable.
double ParseRate(const std::string& rate) {
  std::istringstream in(rate);
  double value = 0;
  std::string unit;
  if (!(in >> value >> unit) || value < 0) return 0;
  if (absl::StartsWith(unit, "Gb")) return value;
  if (absl::StartsWith(unit, "Mb")) return value / 1000;
  return 0;
}

void DiscoverRdma(const fs::path& sys, v1::NodeTopology* out) {
  const fs::path ib = sys / "class/infiniband";
  for (const std::string& dev : List(ib)) {
    // Netdevs on the same PCI function (mlx5 Ethernet/RoCE ports, IPoIB interfaces).
    std::vector<std::string> netdevs = List(ib / dev / "device/net");
    for (const std::string& port : List(ib / dev / "ports")) {
      const fs::path p = ib / dev / "ports" / port;
      const std::string rdma_name = absl::StrCat(dev, ":", port);
      const double gbps = ParseRate(ReadLine(p / "rate").value_or(""));
      // "4: ACTIVE" -> "ACTIVE"
      std::string state = ReadLine(p / "state").value_or("");
      if (const size_t colon = state.find(':'); colon != std::string::npos) {
        state = std::string(absl::StripAsciiWhitespace(state.substr(colon + 1)));
      }
      const std::string link_layer = ReadLine(p / "link_layer").value_or("");
      // A port's netdev: the one at the same position (ports count from 1), else none.
      v1::Nic* nic = nullptr;
      int port_no = 0;
      if (absl::SimpleAtoi(port, &port_no) && port_no >= 1 &&
          port_no <= static_cast<int>(netdevs.size())) {
        for (v1::Nic& n : *out->mutable_nics()) {
          if (n.name() == netdevs[port_no - 1]) nic = &n;
        }
      }
      if (nic == nullptr) {
        nic = out->add_nics();
        nic->set_name(rdma_name);
        nic->set_state(state);
        SetNuma(ib / dev / "device/numa_node", nic);
      }
      nic->set_rdma_device(rdma_name);
      nic->set_link_layer(link_layer);
      // The RDMA rate is what UCX's verbs transports get; prefer it to the netdev's.
      if (gbps > 0) nic->set_speed_gbps(gbps);
      if (!nic->has_numa_node()) SetNuma(ib / dev / "device/numa_node", nic);
    }
  }
}

void DiscoverNuma(const fs::path& sys, v1::NodeTopology* out) {
  const fs::path nodes = sys / "devices/system/node";
  std::vector<std::pair<int, std::string>> found;
  for (const std::string& name : List(nodes)) {
    int id = 0;
    if (!absl::StartsWith(name, "node") || !absl::SimpleAtoi(name.substr(4), &id) || id < 0) {
      continue;
    }
    std::optional<std::string> cpus = ReadLine(nodes / name / "cpulist");
    if (!cpus.has_value() || !ParseCpuList(*cpus).ok()) continue;
    found.emplace_back(id, *cpus);
  }
  if (found.empty()) {
    // No NUMA support in the kernel: every online CPU on node 0.
    std::optional<std::string> online = ReadLine(sys / "devices/system/cpu/online");
    if (online.has_value() && ParseCpuList(*online).ok()) found.emplace_back(0, *online);
  }
  std::sort(found.begin(), found.end());
  for (const auto& [id, cpus] : found) {
    v1::NumaNode* numa = out->add_numa_nodes();
    numa->set_id(id);
    numa->set_cpus(cpus);
  }
}

// "Key:   value" lines of /proc/driver/nvidia/gpus/<bdf>/information.
std::map<std::string, std::string> ReadKeyValues(const fs::path& path) {
  std::map<std::string, std::string> kv;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    kv[std::string(absl::StripAsciiWhitespace(line.substr(0, colon)))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return kv;
}

void DiscoverGpus(const fs::path& sys, const fs::path& proc, v1::NodeTopology* out) {
  const fs::path gpus = proc / "driver/nvidia/gpus";
  struct Found {
    std::string bus;
    std::string model;
  };
  std::vector<Found> found;
  for (const std::string& entry : List(gpus)) {
    std::map<std::string, std::string> info = ReadKeyValues(gpus / entry / "information");
    if (info.empty()) continue;
    std::string bus = info.count("Bus Location") > 0 ? info["Bus Location"] : entry;
    found.push_back({absl::AsciiStrToLower(bus), info["Model"]});
  }
  // CUDA_DEVICE_ORDER=PCI_BUS_ID order, which is what launchers pin local ranks by.
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.bus < b.bus; });
  for (size_t i = 0; i < found.size(); ++i) {
    v1::Gpu* gpu = out->add_gpus();
    gpu->set_index(static_cast<int>(i));
    gpu->set_name(found[i].model);
    gpu->set_pci_bus_id(found[i].bus);
    std::optional<int> numa = ReadInt(sys / "bus/pci/devices" / found[i].bus / "numa_node");
    if (numa.has_value() && *numa >= 0) gpu->set_numa_node(*numa);
  }
}

}  // namespace

absl::StatusOr<v1::NodeTopology> Discover(const std::string& root) {
  const fs::path sys = fs::path(root) / "sys";
  const fs::path proc = fs::path(root) / "proc";
  if (!Exists(sys)) {
    return absl::NotFoundError(absl::StrCat("discovery: ", sys.string(), " does not exist"));
  }
  v1::NodeTopology out;
  out.set_node(ReadLine(proc / "sys/kernel/hostname").value_or(""));
  DiscoverNetdevs(sys, &out);
  DiscoverRdma(sys, &out);
  DiscoverNuma(sys, &out);
  DiscoverGpus(sys, proc, &out);
  return out;
}

v1::NodeTopology MergeDiscovered(v1::NodeTopology declared, const v1::NodeTopology& discovered) {
  if (declared.node().empty()) declared.set_node(discovered.node());
  if (declared.gpus_size() == 0) *declared.mutable_gpus() = discovered.gpus();
  if (declared.numa_nodes_size() == 0) *declared.mutable_numa_nodes() = discovered.numa_nodes();
  if (declared.nics_size() == 0) *declared.mutable_nics() = discovered.nics();
  for (v1::Rail& rail : *declared.mutable_rails()) {
    if (rail.device().empty()) continue;
    for (const v1::Nic& nic : declared.nics()) {
      if (nic.name() != rail.device() && nic.rdma_device() != rail.device()) continue;
      if (rail.speed_gbps() <= 0) rail.set_speed_gbps(nic.speed_gbps());
      if (!rail.has_numa_node() && nic.has_numa_node()) rail.set_numa_node(nic.numa_node());
      break;
    }
  }
  return declared;
}

}  // namespace railyard::topology
