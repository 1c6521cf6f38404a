// From every member daemon's view of one communicator (v1::CommState), what it waits for:
// a rank that has not submitted, nodes that disagree on an operation, a transfer that does not
// complete, a daemon that does not answer. Pure: no clock, no I/O (railctl diagnose; unit tested
// with hand-made states).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "railyard/v1/diagnose.pb.h"

namespace railyard::diagnose {

struct Unanswered {
  int node = -1;  // index in the communicator's node order
  std::string name;
  std::string why;  // e.g. "DEADLINE_EXCEEDED after 2 s"
};

// states: the views that arrived (any order, at most one per node); unanswered: the member
// daemons that did not answer; stall: how long an operation (or a transfer) may be pending
// before it is a finding. The verdicts come most likely cause first; healthy when there are no
// findings (its one verdict then says so).
v1::CommDiagnosis Diagnose(const std::vector<v1::CommState>& states,
                           const std::vector<Unanswered>& unanswered, absl::Duration stall);

// The first transfer of st's running operation `seq` with node `node` on `rail` (any rail when
// rail < 0) that has waited at least min_age_s; null when st does not run seq or none has.
const v1::TransferProgress* WaitOn(const v1::CommState& st, uint64_t seq, int node, int rail,
                                   double min_age_s);

// "allreduce float count=1024 (4 KiB) sum": how verdicts and the daemons' disagreement errors
// (daemon/comm/op_digest.h) name an operation.
std::string Describe(const v1::OpProgress& op);
// "4 KiB" for 4096, "684 B" for 684: binary units only where they are exact.
std::string ExactBytes(uint64_t bytes);

// "0-4, 6-7" for {0,1,2,3,4,6,7}.
std::string RankRanges(std::vector<int> ranks);

}  // namespace railyard::diagnose
