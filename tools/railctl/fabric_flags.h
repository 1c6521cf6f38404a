// The fabric flags `railctl model` and `railctl simulate` share: either a topology file
// (--topology FILE, its "fabric" section) or the shorthand
//   --nranks N [--ranks-per-node G] [--rails R] --alpha T --beta BW
//   [--alpha-intra T] [--beta-intra BW] [--overhead T]
//   [--torus XxY[xZ]] [--nodes-per-rack P --oversubscription X] [--in-network]
// --beta is per NIC; --rails defaults to one NIC per local rank (DGX-style); --alpha-intra and
// --beta-intra default to --alpha and --beta. --torus models X*Y[*Z] nodes of one rank each
// instead of nodes x ranks (--nranks, if given, must match).
#pragma once

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/scheduler/cost/tuner.h"
#include "daemon/topology/fabric.h"
#include "tools/railctl/flag_set.h"

namespace railyard::railctl {

// Names of the flags above (without "--"), to pass to ParseFlags.
const std::set<std::string>& FabricValueFlags();
const std::set<std::string>& FabricBoolFlags();

absl::StatusOr<topology::FabricSpec> FabricFromFlags(const ParsedFlags& flags);

// --message-cpu T and --reduce-bw BW (the tuner's CPU terms, TunerOptions::message_cpu_s and
// reduce_bytes_per_s) into *options; absent: 0, not priced.
inline const char* const kTunerCpuFlags[] = {"message-cpu", "reduce-bw"};
absl::Status TunerCpuFromFlags(const ParsedFlags& flags, scheduler::cost::TunerOptions* options);

}  // namespace railyard::railctl
