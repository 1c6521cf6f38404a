// What this machine has, read from sysfs and procfs (no CUDA, no libibverbs): NICs
// (/sys/class/net: operstate, speed, numa_node, virtual or not), RDMA ports
// (/sys/class/infiniband: rate, state, link layer, their netdev), NUMA nodes and CPUs
// (/sys/devices/system/node, else /sys/devices/system/cpu/online as one node) and NVIDIA GPUs
// (/proc/driver/nvidia/gpus/*/information, NUMA from /sys/bus/pci/devices). The root is a
// parameter so tests can point it at a fake tree.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "railyard/v1/topology.pb.h"

namespace railyard::topology {

// root: the directory holding sys/ and proc/ ("/" on a real machine). The result has node (the
// hostname from proc/sys/kernel/hostname), nics, gpus and numa_nodes; no rails. What cannot be
// read is left out (a NIC's speed 0, its numa_node absent). NOT_FOUND when root/sys does not
// exist.
absl::StatusOr<v1::NodeTopology> Discover(const std::string& root = "/");

// A daemon's graph: `declared` (its --topology file or the default) completed by `discovered`
// for what the file does not say: GPUs, NUMA nodes and NICs when it lists none, and each rail's
// speed_gbps (when 0) and numa_node (when absent) from the NIC its device names. The rails
// themselves (names, devices, transports, order) are the declared ones.
v1::NodeTopology MergeDiscovered(v1::NodeTopology declared, const v1::NodeTopology& discovered);

}  // namespace railyard::topology
