// The cost model this daemon keeps and hands to the communicators it coordinates (the
// calibration under --state_dir, else the built-in defaults; railctl calibrate stores a new one)
// and railctl explain: the candidates a multi-node communicator weighs for an operation.
#pragma once

#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/comm/comm_registry.h"
#include "railyard/v1/admin.pb.h"
#include "railyard/v1/cost.pb.h"

namespace railyard {

class Tuning {
 public:
  // state_dir: --state_dir. comms: the communicators explain looks at (must outlive this).
  // on_model: called with each model put in use (the coordinator's bootstrap hands it out).
  Tuning(std::string state_dir, CommRegistry* comms,
         std::function<void(const v1::CostModel&)> on_model);
  Tuning(const Tuning&) = delete;
  Tuning& operator=(const Tuning&) = delete;

  // Reads <state_dir>/calibration.json (the defaults when it is absent or unreadable, logged).
  void LoadAtStart();
  v1::CostModel CostModel();
  // Validates, persists (<state_dir>/calibration.json) and uses a new calibration for the
  // communicators created from now on; returns the file's path. INVALID_ARGUMENT for a model
  // that does not validate, FAILED_PRECONDITION when it cannot be stored.
  absl::StatusOr<std::string> SetCalibration(const v1::CostModel& model);
  // railctl explain. INVALID_ARGUMENT for an op or dtype it does not know, or when several
  // multi-node communicators could be meant; NOT_FOUND when none matches; FAILED_PRECONDITION
  // for one without a tuner.
  absl::StatusOr<v1::ExplainResponse> Explain(const v1::ExplainRequest& req);

 private:
  void Use(const v1::CostModel& model);

  const std::string state_dir_;
  CommRegistry* const comms_;
  const std::function<void(const v1::CostModel&)> on_model_;
  absl::Mutex mu_;
  v1::CostModel model_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard
