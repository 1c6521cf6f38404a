// `railctl calibrate`: measures a live communicator and fits the cost model's link classes.
//   railctl calibrate --daemons S0,S1[,...] [--ranks-per-daemon G] [--op OP] [--algo A]
//                     [-b SIZE] [-e SIZE] [-f N] [-n ITERS] [-w WARMUP] [--perf PATH]
//                     [--timeout S] [--dry-run] [--json]
// 1. railyard-perf on the first daemon alone (G ranks): fits the per-operation overhead and
//    the intra-node bandwidth against the IR of the local plan's direct schedule;
// 2. railyard-perf across all daemons with --algo forced: fits the inter-node alpha and beta
//    (least squares, relative error) against the IR of that algorithm's schedule on that layout,
//    with the intra figures of step 1 held;
// 3. compares the fitted model's prediction with every measured size, and (unless --dry-run)
//    stores the fit on every daemon (Admin.SetCalibration -> <state_dir>/calibration.json),
//    recording the configuration it holds for (PRIMER section 7).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace railyard::railctl {

absl::Status RunCalibrate(const std::vector<std::string>& args);

}  // namespace railyard::railctl
