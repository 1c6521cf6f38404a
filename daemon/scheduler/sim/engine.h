// The simulator's core, below the public API (simulator.h): the links and routes of a FabricSpec
// (FabricModel), a compact dependency graph of flows (FlowGraph, built from RankSchedules or
// synthesised for innetwork) and the event-driven run (Engine). The model is described in
// simulator.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/scheduler/sim/simulator.h"
#include "daemon/topology/fabric.h"

namespace railyard::scheduler::sim {

enum Tier : uint8_t { kTierIntra, kTierNic, kTierSpine, kTierTorus, kNumTiers };
const char* TierName(int tier);

// Flow endpoints are fabric ranks (node * G + slot) or the in-network switch.
inline constexpr int32_t kSwitch = -1;

class FabricModel {
 public:
  // fabric must have passed CheckFabric.
  explicit FabricModel(const topology::FabricSpec& fabric);

  const topology::FabricSpec& fabric() const { return f_; }
  int nlinks() const { return static_cast<int>(capacity_.size()); }
  double capacity(uint32_t link) const { return capacity_[link]; }
  Tier tier(uint32_t link) const { return static_cast<Tier>(tier_[link]); }
  std::string Name(uint32_t link) const;
  bool HasTier(int tier) const;

  // The links of a flow from src to dst (fabric ranks or kSwitch, not both; src != dst) appended
  // to route; *inter: whether it pays the inter-node alpha; *tiers: bit (1 << tier) per tier.
  void Route(int32_t src, int32_t dst, std::vector<uint32_t>* route, bool* inter, uint32_t* tiers,
             uint16_t stripe = 0) const;
  // The rail a flow from fabric rank src (not kSwitch) takes across nodes: its own (local index
  // mod R), or with fewer ranks per node than rails its rails in turn by stripe
  // (CommLayout::rail_for).
  int Rail(int32_t src, uint16_t stripe) const {
    const int ss = src % g_;
    return g_ >= r_ ? ss % r_ : ss + g_ * (stripe % ((r_ - ss + g_ - 1) / g_));
  }

 private:
  uint32_t Intra(int node, int slot, int dir) const {
    return static_cast<uint32_t>((node * g_ + slot) * 2 + dir);
  }
  uint32_t Nic(int node, int rail, int dir) const {
    return static_cast<uint32_t>(nic_base_ + (node * r_ + rail) * 2 + dir);
  }
  uint32_t Spine(int rack, int dir) const {
    return static_cast<uint32_t>(spine_base_ + rack * 2 + dir);
  }
  uint32_t TorusLink(int node, int dim, int dir) const {
    return static_cast<uint32_t>(torus_base_ + (node * ndims_ + dim) * 2 + dir);
  }
  std::string NodeName(int node) const;

  topology::FabricSpec f_;
  int g_ = 1, r_ = 1, ndims_ = 0;
  int64_t nic_base_ = 0, spine_base_ = 0, torus_base_ = 0;
  std::vector<int> stride_;  // torus coordinate strides
  std::vector<double> capacity_;
  std::vector<uint8_t> tier_;
};

// A flow of the graph: one transfer of a job's schedule, or a synthetic innetwork flow.
struct Flow {
  enum Flags : uint8_t {
    kNoAlpha = 1,  // streams right behind the previous flow of its stream: no alpha
    kJoin = 2,     // zero-cost synchronisation point (the switch has every rank's chunk)
  };
  uint64_t bytes = 0;
  int32_t src = 0;  // fabric rank or kSwitch
  int32_t dst = 0;
  uint32_t job = 0;
  uint8_t flags = 0;
  // Inter-node flows of its (src, dst) stream before this one (AddSchedule): picks the rail
  // when a node has fewer ranks than rails, as CommLayout::rail_for does in the daemon.
  uint16_t stripe = 0;
};

// Flows with their dependencies as counts (ndeps) and the reverse edges in CSR form.
struct FlowGraph {
  std::vector<Flow> flows;
  std::vector<uint32_t> ndeps;
  std::vector<uint64_t> next_begin = {0};  // flows.size() + 1 entries
  std::vector<uint32_t> next;

  // Appends a schedule of job `job`: its rank r is fabric rank frank[r]. INVALID_ARGUMENT when a
  // transfer names a rank outside frank or a dep that is not earlier.
  absl::Status AddSchedule(const RankSchedule& schedule, const std::vector<int32_t>& frank,
                           uint32_t job);
  // Appends flows (their job set) whose deps are local indices into `flows` given in CSR form
  // (deps of flow i: deps[begin[i] .. begin[i+1])), each earlier than i.
  void AddFlows(const std::vector<Flow>& flows, const std::vector<uint64_t>& begin,
                const std::vector<uint32_t>& deps);
};

struct EngineResult {
  std::vector<double> job_time;                   // per job
  std::vector<std::vector<TierStats>> job_tiers;  // per job, kNumTiers entries
  std::vector<uint64_t> job_flows;
  std::vector<uint64_t> link_bytes;
  std::vector<double> link_busy;
};

// Runs the graph on the fabric (the model: simulator.h). Flows with the same (src, dst, job) are
// one pair's messages, delivered in posting order. INTERNAL if some flow never becomes ready (a
// cycle).
absl::Status RunEngine(const FabricModel& model, const FlowGraph& graph, int njobs,
                       EngineResult* result);

}  // namespace railyard::scheduler::sim
