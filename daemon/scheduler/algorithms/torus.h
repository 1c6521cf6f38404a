// Torus (TPU-pod style) dimension-ordered rings: one rank per node, rank r at coordinates
// x = r % X, y = (r / X) % Y, z = r / (X Y); the ring of each line of a dimension is made of
// torus neighbours, so on a torus fabric every transfer is one hop.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "daemon/scheduler/algorithms/builder.h"

namespace railyard::scheduler::algorithms {

// OK when layout.torus_dims is set, every dimension >= 1, their product is nranks and every node
// holds exactly one rank; INVALID_ARGUMENT saying which of these fails otherwise.
absl::Status CheckTorusLayout(const CommLayout& layout);

// AllReduce: ring ReduceScatter along dim 0 within each dim-0 line, then along dim 1 on the shard
// each rank owns, ...; then ring AllGather in reverse dimension order. Latency 2 sum(d_i - 1)
// steps, bandwidth 2 (N-1)/N M per rank. ReduceScatter / AllGather: the same phases on the
// ranks' blocks (forward order for both).
absl::Status GenerateTorus(ScheduleBuilder& b);

}  // namespace railyard::scheduler::algorithms
