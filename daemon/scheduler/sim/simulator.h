// The fabric simulator: runs the schedule IR (the RankSchedule every daemon derives and executes)
// of one or more concurrent jobs on a modelled fabric (topology::FabricSpec) and reports when
// each job finishes, the bytes each tier carried and the busiest link. docs/simulation.md has the
// model in full; in short:
//  - Flow level, event driven. A transfer is posted once its deps are done: the sender pays its
//    CPU overhead FabricSpec::overhead_s (serialised per sending rank: LogP o never overlaps),
//    then the message pays its link class's alpha (a fixed delay, no link held), then moves its
//    bytes at the rate the links of its route give it.
//  - Messages of one pair (source rank, destination rank, job) are delivered in the order they
//    were posted, as a NIC / UCX endpoint does (a rank posts what becomes ready at the same
//    instant in schedule order): only the pair's head moves bytes; the next one's bytes start
//    when the head's end, or when its own alpha ends if that is later. Alpha is wire latency
//    (LogP L): it overlaps the previous message's bytes, so a chain of C chunks over H hops
//    takes (H + C - 1) chunk/beta + H alpha, and one message alpha + n/beta.
//  - Links are resources with a capacity (bytes/s) shared by the pairs' heads. Contention model:
//    EQUAL SHARE OF THE BOTTLENECK: a flow's rate is min over its links of capacity / (flows on
//    that link), recomputed for the flows of a link whenever a flow joins or leaves it. Unlike
//    max-min fairness it does not hand the share a flow cannot use (bottlenecked elsewhere) to
//    the others, so it is conservative when flows with different bottlenecks mix; it is exact
//    for the symmetric patterns collectives produce and costs O(flows on the touched links) per
//    event (at most one flow per pair: chunks queue, they do not multiply the flows).
//  - Self transfers (src rank == dst rank: staging copies, own contributions) cost 0; so do the
//    memory-bandwidth costs of reductions (not modelled).
//  - Routes: same node: src rank's intra egress port + dst rank's intra ingress port (intra
//    class). Other node: src node's NIC on the src rank's rail (local index mod R) tx + dst
//    node's NIC on the same rail rx (inter class); two_tier / flat / rail_optimized switches are
//    non-blocking and add no link; three_tier adds the src rack's uplink and the dst rack's
//    downlink (capacity nodes_per_rack * rails * inter.beta / oversubscription) when the racks
//    differ; a torus has no NIC links but one link per node, dimension and direction (capacity
//    inter.beta) and routes dimension-ordered, the shorter way round (ties: +), one alpha per
//    transfer.
//  - "innetwork" (SHARP) has no IR generator the daemons could run: the simulator builds its
//    flows itself (modelled, not executable). Every rank streams M up to the switch over its NIC
//    (rail) in chunks, the switch reduces a chunk once every rank's copy arrived and streams it
//    back down to every rank: ~ 2 alpha + M/beta. AllReduce only, fabrics with
//    in_network_reduction (not torus).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/topology/fabric.h"

namespace railyard::scheduler::sim {

inline constexpr const char* kAlgoInNetwork = "innetwork";

// Above this many transfers (estimated before generating, see EstimateTransfers) a job is refused
// with INVALID_ARGUMENT instead of thrashing: ~ 40M transfers is ~ 4 GB of schedule.
inline constexpr uint64_t kMaxSimulatedTransfers = 40'000'000;

// Chunk size the innetwork flows stream in when JobSpec::chunk_bytes is 0: M / kInNetworkChunks
// (at least 64 KiB), so the pipeline fill costs ~1% of M/beta.
inline constexpr uint64_t kInNetworkChunks = 128;

struct JobSpec {
  std::string name;
  OpShape shape;
  std::string algorithm;   // a Generate() name or innetwork (cost::Tune picks one)
  size_t chunk_bytes = 0;  // 0: unchunked
  std::vector<int> nodes;  // fabric node of each job node; empty = 0..K-1 (the whole fabric)
  int ranks_per_node = 0;  // 0 = fabric's; job local rank i sits on the node's slot i
};

// Tiers: "intra" (rank <-> rank in a node), "nic" (node NIC links), "spine" (three-tier rack
// uplinks/downlinks), "torus" (torus neighbour links). A transfer counts once (bytes, one
// message) in every tier its route crosses, whatever the number of links it uses there.
struct TierStats {
  std::string tier;
  uint64_t bytes = 0;
  uint64_t messages = 0;
};

// One link: "node3/local2 tx", "node3/rail1 rx", "rack2 up", "torus (1,2)->(2,2)".
// busy_s: time at least one flow was moving bytes over it.
struct LinkStats {
  std::string name;
  std::string tier;
  uint64_t bytes = 0;
  double busy_s = 0;
};

struct JobResult {
  std::string name, algorithm;
  double time_s = 0;             // completion of its last transfer (every job starts at t = 0)
  uint64_t transfers = 0;        // flows simulated (innetwork: its synthetic flows)
  std::vector<TierStats> tiers;  // only tiers the fabric has, in the order above
};

struct SimResult {
  double time_s = 0;  // the last job's completion
  std::vector<JobResult> jobs;
  std::vector<TierStats> tiers;
  // The link with the most bytes / capacity (the time it needs at full rate: the bottleneck),
  // ties: longest busy_s; empty name if nothing moved.
  LinkStats busiest_link;
  uint64_t transfers = 0;
  double wall_s = 0;             // generation + simulation, this process
  std::vector<LinkStats> links;  // every link that carried bytes, when SimOptions::all_links
};

struct SimOptions {
  bool all_links = false;
};

// Validates the fabric (positive sizes and bandwidths, torus dims matching nodes, racks).
absl::Status CheckFabric(const topology::FabricSpec& fabric);

// Runs all jobs concurrently on the shared fabric (jobs on overlapping nodes share their links'
// bandwidth). INVALID_ARGUMENT for an invalid fabric, no jobs, job nodes out of range or
// duplicated, ranks_per_node above the fabric's, an algorithm that does not implement the op or
// the layout (Generate's message), innetwork where it does not apply, and jobs estimated above
// kMaxSimulatedTransfers. Messages name the job.
absl::StatusOr<SimResult> Simulate(const topology::FabricSpec& fabric,
                                   const std::vector<JobSpec>& jobs,
                                   const SimOptions& options = {});

// One already generated schedule; layout node k is fabric node k and local index i its slot i.
// Allocation-light (the tuner calls it repeatedly for small communicators). INVALID_ARGUMENT
// when the layout does not fit the fabric or the schedule names ranks outside the layout.
absl::StatusOr<JobResult> SimulateSchedule(const RankSchedule& schedule, const CommLayout& layout,
                                           const topology::FabricSpec& fabric);

// Transfers Generate(algo, ...) (or innetwork) would produce, estimated within ~2x from the
// algorithm's step count plus the bytes it moves / chunk_bytes; used for the budget above.
uint64_t EstimateTransfers(const std::string& algo, const OpShape& shape, const CommLayout& layout,
                           size_t chunk_bytes);

// The layout a job gets: Uniform(job nodes, ranks per node, fabric rails), plus the fabric's
// torus_dims when the job spans the whole torus in node order with one rank per node.
CommLayout JobLayout(const topology::FabricSpec& fabric, const JobSpec& job);

}  // namespace railyard::scheduler::sim
