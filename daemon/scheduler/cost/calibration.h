// Calibration: the effective alpha-beta figures of a communicator's link classes, and the
// configuration they were measured on (PRIMER section 7: a fit holds only for the collective,
// algorithm, rank placement and topology it was measured with). `railctl calibrate` fits one by
// least squares over a size sweep (FitLinkClass); the daemon persists it as JSON under its state
// directory and the coordinator of a communicator hands its calibration to every member, so all
// daemons of a comm cost schedules with the same numbers and pick the same algorithm.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/topology/fabric.h"

namespace railyard::scheduler::cost {

struct Calibration {
  topology::LinkClass intra;  // rank <-> rank inside a node (shared memory through the daemon)
  topology::LinkClass inter;  // daemon <-> daemon, per rail
  double overhead_s = 0;      // per message, sender CPU
  // Per operation, once: the client's submission and completion through the daemon (gRPC),
  // the same for every algorithm, so it never changes a choice; it makes predictions comparable
  // with what a rank measures.
  double op_overhead_s = 0;
  // Per inter-node message, at each end (sent or received): the CPU a transport operation and a
  // schedule step cost there; and the rate a daemon reduces at (what it receives from another
  // node, and a rank's own staged bytes). The fabric simulator overlaps both with the transfers, as
  // on a NIC that moves the bytes itself; on a software transport (TCP) the same cores move the
  // bytes, so the tuner adds them, for the busiest rank, to every schedule prediction
  // (TunerOptions). railctl calibrate does not fit them (its sweep runs one algorithm at one chunk
  // size): a fit keeps the figures it had. 0: not priced.
  double message_cpu_s = 0;
  double reduce_bytes_per_s = 0;
  // "default" (built-in, uncalibrated) or "fit".
  std::string source = "default";
  // What the fit holds for.
  std::string op, algorithm, placement, topology, fitted_at;
  int nranks = 0, nnodes = 0;
  int samples = 0;
  double rms_relative_error = 0;  // of the fit over its samples

  // Figures for loopback virtual nodes on a small VM (TCP over lo between daemons, memcpy
  // through the daemon inside a node), used until a calibration is stored.
  static Calibration Defaults();
};

// Checks every figure is finite, alphas, overheads and the fit's error >= 0 and betas > 0;
// INVALID_ARGUMENT naming the field.
absl::Status Validate(const Calibration& c);
std::string ToJson(const Calibration& c);
// INVALID_ARGUMENT for text that is not such a JSON object, a missing link class, a field of the
// wrong type (nranks, nnodes and samples: integers in int's range) or what Validate refuses.
absl::StatusOr<Calibration> FromJson(const std::string& json);
// The file lives at <state_dir>/calibration.json. Load: NOT_FOUND when absent.
absl::Status SaveCalibration(const std::string& state_dir, const Calibration& c);
absl::StatusOr<Calibration> LoadCalibration(const std::string& state_dir);

// One measurement of a size sweep: T = alpha * latency_units + bytes_units / beta, where the
// units come from the cost model of the measured schedule (IR-based prediction with alpha = 1,
// beta = infinity gives latency_units; alpha = 0, beta = 1 gives bytes_units).
struct Sample {
  double latency_units = 0;
  double bytes_units = 0;
  double measured_s = 0;
};
struct LinearFit {
  topology::LinkClass link;
  double overhead_s = 0;  // the constant term (FitLinkClassWithOverhead; 0 otherwise)
  double rms_relative_error = 0;
};
// Least squares on relative error (each sample weighted by 1/measured, so small and large sizes
// count alike), alpha and 1/beta constrained to >= 0. INVALID_ARGUMENT with fewer than 2 samples,
// non-positive measurements, a degenerate sweep (all samples proportional) or one whose time
// does not grow with its bytes (no bandwidth: the bytes term would explain under 0.1 % of every
// sample).
absl::StatusOr<LinearFit> FitLinkClass(const std::vector<Sample>& samples);
// The same with a constant term, T = overhead + alpha * latency_units + bytes_units / beta, all
// three >= 0: for a sweep that has no other measurement of the per-operation overhead (one rank
// per daemon: no intra-node sweep to take it from). INVALID_ARGUMENT as FitLinkClass, and with
// fewer than 3 samples.
absl::StatusOr<LinearFit> FitLinkClassWithOverhead(const std::vector<Sample>& samples);

}  // namespace railyard::scheduler::cost
