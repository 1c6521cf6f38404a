// FabricSpec: the modelled fabric a cost-model prediction or a simulation runs on. Built from a
// topology file's "fabric" section (daemon/topology/topology_file.h), from railctl's shorthand
// flags (--nranks, --ranks-per-node, --rails, --alpha, --beta, ...) or from a live communicator's
// layout plus its calibrated link classes. Pure data: the scheduler's cost model and simulator
// read it; nothing here does I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace railyard::topology {

// Alpha-beta (Hockney) parameters of one class of links, one direction.
struct LinkClass {
  double alpha_s = 0;           // per-message start-up cost, seconds
  double beta_bytes_per_s = 0;  // bandwidth, bytes per second (per port / per NIC)
};

enum class FabricKind : uint8_t {
  kFlat,           // every rank its own node behind one non-blocking switch (G = 1)
  kTwoTier,        // K nodes x G ranks: intra-node links + one non-blocking inter-node switch
  kRailOptimized,  // two-tier with R NICs per node, one switch per rail
  kThreeTier,      // racks of nodes_per_rack nodes; rack uplinks oversubscribed R:1 to spines
  kTorus,          // nodes on an X x Y [x Z] torus, links to neighbours only
};

// "flat", "two_tier", "rail_optimized", "three_tier", "torus".
const char* FabricKindName(FabricKind kind);
// Accepts the names above (and "two-tier", "rail-optimized", "three-tier"); false if unknown.
bool ParseFabricKind(const std::string& name, FabricKind* kind);

struct FabricSpec {
  FabricKind kind = FabricKind::kTwoTier;
  int nodes = 1;           // K (for a torus: the product of torus_dims)
  int ranks_per_node = 1;  // G
  int rails = 1;           // R: NICs per node; local rank i uses NIC i mod R
  LinkClass intra;         // rank <-> rank inside a node (NVLink, PCIe, shared memory), per port
  LinkClass inter;         // node <-> node, per NIC
  double overhead_s = 0;   // LogP o: CPU cost per message on the sender, never overlapped
  // kThreeTier: nodes per rack (leaf switch) and the leaf->spine oversubscription R (R:1, >= 1).
  int nodes_per_rack = 0;
  double oversubscription = 1;
  // kTorus: dimension sizes (2 or 3 of them); nodes == product.
  std::vector<int> torus_dims;
  // Switches reduce in flight (SHARP): the "innetwork" algorithm applies.
  bool in_network_reduction = false;

  int nranks() const { return nodes * ranks_per_node; }
};

}  // namespace railyard::topology
