// Closed-form alpha-beta costs of the collectives (PRIMER.md sections 1-4), per algorithm, on a
// FabricSpec. These are the formulas operators reason with and the fallback for clusters too
// large to generate the schedule IR of; the tuner prefers the IR-based prediction
// (daemon/scheduler/cost/ir_cost.h) wherever it can afford it, because it costs hierarchical,
// rail and torus compositions with the same code that runs them.
//
// Conventions (PRIMER): M is bytes per rank as the PRIMER's table states it per op: AllReduce,
// Broadcast, Reduce: the buffer; AllGather: the full output; ReduceScatter: the full input;
// AllToAll: the bytes each rank sends in total. Every time is latency + bandwidth, where the
// latency term counts dependent message steps x (alpha + o).
//
// Link classes on a K x G (x R rails) fabric: a flat algorithm (ring, tree, rhd, dbtree, direct)
// is one algorithm over all N = K G ranks; across nodes its hops are bounded by the slowest
// link ("bounded by its slowest hop", PRIMER section 3): alpha_hop = max(intra, inter) and
// beta_hop = min(intra, inter). Phases in which every local rank crosses the node at once
// (rhd's, direct's, hier's inter phase) share the node's R NICs: each rank gets
// beta_inter * min(1, R / G).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/scheduler/op.h"
#include "daemon/topology/fabric.h"

namespace railyard::scheduler::cost {

struct Estimate {
  std::string algorithm;
  double latency_s = 0;
  double bandwidth_s = 0;
  std::string formula;  // the expression evaluated, for `railctl model` and `explain`
  double time_s() const { return latency_s + bandwidth_s; }
};

// Model names (railctl model): ring, tree (binary tree, reduce then broadcast of full messages),
// rhd, rd (recursive doubling), dbtree (double binary tree, pipelined), hier, direct, torus,
// innetwork. "tree" here is the PRIMER's unsegmented tree; the executable "tree" algorithm of
// the scheduler is the pipelined double binary tree, whose closed form is "dbtree".
//
// Every algorithm with a closed form for op on fabric, in a fixed order. hier needs K > 1 and
// G > 1; torus a torus fabric; innetwork fabric.in_network_reduction (AllReduce only).
// INVALID_ARGUMENT for point-to-point ops, bytes < 0, or a fabric without positive bandwidths.
absl::StatusOr<std::vector<Estimate>> ClosedForms(OpKind op, double bytes,
                                                  const topology::FabricSpec& fabric);

// PRIMER section 1: n* = alpha * beta.
double CriticalSize(const topology::LinkClass& link);

// PRIMER section 2, ring vs tree (AllReduce) crossover for n ranks on one link class:
struct Crossover {
  double exact_bytes = 0;         // n* ((N-1) - log2 N) / (log2 N - (N-1)/N) (power-of-two N)
  double log_estimate_bytes = 0;  // N alpha beta / log2 N
  double rough_bytes = 0;         // N alpha beta
};
// INVALID_ARGUMENT for nranks < 2.
absl::StatusOr<Crossover> RingTreeCrossover(int nranks, const topology::LinkClass& link);

// PRIMER section 4: lower bounds of an AllToAll where each rank sends `bytes` in total (1/N of it
// to itself), uniform routing.
struct AllToAllBounds {
  double per_transfer_s = 0;  // alpha + (M / N) / beta: one of the N-1 messages
  double injection_s = 0;     // alpha + (N-1)/N M / beta_inject at the source
  double ejection_s = 0;      // the same at the busiest receiver (uniform: equal)
  double bisection_s = 0;     // bytes across the bisection / (N beta / (2 R_oversub))
  double lower_bound_s = 0;   // the largest of the above
};
AllToAllBounds AllToAllLowerBounds(double bytes, const topology::FabricSpec& fabric);

}  // namespace railyard::scheduler::cost
