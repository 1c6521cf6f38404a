// From every member daemon's view of one communicator (v1::CommState), what it waits for:
// a rank that has not submitted, nodes that disagree on an operation, a transfer that does not
// complete, a daemon that does not answer. Pure: no clock, no I/O (railctl diagnose; unit tested
// with hand-made states).
#pragma once

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

// "0-4, 6-7" for {0,1,2,3,4,6,7}.
std::string RankRanges(std::vector<int> ranks);

}  // namespace railyard::diagnose
