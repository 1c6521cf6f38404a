// scheduler::cost::Calibration <-> railyard.v1.CostModel (peer and admin protos).
#pragma once

#include "daemon/scheduler/cost/calibration.h"
#include "railyard/v1/cost.pb.h"

namespace railyard {

v1::CostModel ToProto(const scheduler::cost::Calibration& c);
scheduler::cost::Calibration FromProto(const v1::CostModel& m);

}  // namespace railyard
