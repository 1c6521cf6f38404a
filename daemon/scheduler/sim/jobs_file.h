// The simulator's jobs file (railctl simulate --jobs FILE): several jobs sharing one fabric.
//
// {"jobs": [
//    {"name": "a", "op": "allreduce", "size": "256MB", "algo": "hier", "nodes": [0, 1, 2, 3],
//     "ranks_per_node": 8, "chunk": "4MiB"},
//    {"name": "b", "op": "alltoall", "size": "64MiB", "first_node": 4, "num_nodes": 4}
// ]}
//  - op (required): an OpName (allreduce, reducescatter, allgather, broadcast, reduce, alltoall,
//    barrier); point-to-point ops and alltoallv are not accepted.
//  - size (required except for barrier): bytes per rank as in PRIMER (topology::ParseBytes: "1MB"
//    = 10^6, "1MiB" = 2^20, a number = bytes): allreduce/broadcast/reduce: the buffer M;
//    reducescatter/allgather: the full buffer M (N * count); alltoall: what each rank sends in
//    total. Converted to a float32 element count (rounded down; at least one element per rank
//    block when size > 0).
//  - algo: an algorithm name or "innetwork"; absent: railctl simulate asks the tuner.
//  - nodes: fabric nodes of the job in job node order; or first_node (default 0) + num_nodes
//    (default: the rest of the fabric); absent: the whole fabric.
//  - ranks_per_node: default the fabric's. chunk: pipelining chunk (a size), default unchunked.
//  - root: broadcast/reduce root rank, default 0. name: default "job<i>".
// Unknown keys are errors (a misspelt key would otherwise silently change the experiment).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/scheduler/sim/simulator.h"
#include "daemon/topology/fabric.h"

namespace railyard::scheduler::sim {

// INVALID_ARGUMENT naming the job and key for malformed JSON, unknown keys or ops, bad sizes and
// node ranges outside the fabric. Semantic checks (algorithm vs op) happen in Simulate().
absl::StatusOr<std::vector<JobSpec>> ParseJobsJson(const std::string& json,
                                                   const topology::FabricSpec& fabric);

// Element count (float32) for `bytes` per rank of op on nranks ranks, as the jobs file defines.
uint64_t CountForBytes(OpKind op, double bytes, int nranks);

}  // namespace railyard::scheduler::sim
