// The tuner: predicts every candidate algorithm (and chunk size) of an operation on a fabric and
// picks the cheapest. Predictions are IR-based wherever affordable: the candidate's schedule is
// generated with the same Generate() the daemons execute and run through the fabric simulator
// (daemon/scheduler/sim), so hierarchical, rail and torus compositions are costed by the code
// that runs them. Where the schedule would be too large (railctl model on thousands of ranks),
// the closed form (closed_form.h) stands in. The daemon keeps one Tuner per communicator, built
// from the communicator's layout and the calibration its coordinator handed out, and caches the
// choice per operation shape: every daemon of the comm computes the same choice from the same
// inputs (deterministic arithmetic, fixed candidate order, ties to the earlier candidate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/scheduler/cost/closed_form.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/topology/fabric.h"

namespace railyard::scheduler::cost {

struct Candidate {
  std::string name;       // model name: ring, tree, dbtree, rhd, rd, hier, direct, torus, innetwork
  std::string generator;  // the scheduler algorithm that runs it; empty: modelled only
  size_t chunk_bytes = 0;
  bool has_closed_form = false;
  Estimate closed_form;
  bool has_ir = false;
  double ir_time_s = 0;  // the simulator's time plus cpu_s (below)
  uint64_t ir_transfers = 0;
  // Of ir_time_s: the busiest rank's CPU the simulator overlaps with transfers
  // (TunerOptions::message_cpu_s and reduce_bytes_per_s).
  double cpu_s = 0;
  std::string note;  // why there is no IR prediction, or why it does not apply
  // The prediction the tuner compares: IR where available, else the closed form.
  double time_s() const { return has_ir ? ir_time_s : closed_form.time_s(); }
};

struct Choice {
  std::string algorithm;  // generator name (what RAILYARD_ALGO takes); model name if modelled
  std::string model_name;
  size_t chunk_bytes = 0;
  double predicted_s = 0;  // the chosen candidate's time + op_overhead_s
  double op_overhead_s = 0;
  bool ir_based = false;
  std::string reason;
  std::vector<Candidate> candidates;  // every candidate considered, in the fixed order
};

struct TunerOptions {
  // Chunk sizes tried for each executable candidate (0: unchunked); a size at or above the
  // message means unchunked.
  std::vector<size_t> chunk_sizes = {0, 64 << 10, 256 << 10, 1 << 20, 4 << 20};
  // A candidate's chunked schedules predicted within this fraction of its best count as ties,
  // which go to the largest chunk (fewest messages): the model hides a message's alpha and
  // overhead behind a pipeline's transfers, while each also costs both ends work it does not
  // price (docs/data-plane.md, "Chunk size across daemons"). 0: the best prediction only.
  double chunk_tie_tolerance = 0.02;
  // The CPU a daemon spends per message and per reduced byte, which the simulator overlaps with
  // the transfers but a software transport (TCP, whose bytes the same cores move) does not
  // (Calibration::message_cpu_s, reduce_bytes_per_s). Each schedule's prediction adds, for its
  // busiest rank, message_cpu_s per inter-node message it sends or receives plus the bytes it
  // reduces, over reduce_bytes_per_s (received from another node, or on its own memory: not
  // those of another rank of its node, which the simulator prices as a memory step). The first
  // makes fewer, larger chunks win where a message costs more CPU than pipelining saves; the second
  // tells apart schedules that move the same bytes but reduce more of them (recursive doubling on
  // two nodes reduces all of the buffer on each, a ring or the tree half). 0: not priced.
  double message_cpu_s = 0;
  double reduce_bytes_per_s = 0;
  // Largest schedule (transfers) simulated per candidate; beyond it the closed form is used.
  uint64_t max_ir_transfers = 50'000;
  // Also list what the daemons cannot execute (PRIMER's unsegmented "tree", "innetwork").
  bool include_modelled = false;
  // Added to every prediction: the per-operation cost outside the schedule (the client's
  // submission and completion; Calibration::op_overhead_s). Never changes a choice.
  double op_overhead_s = 0;
};

// PRIMER's M for the shape on nranks ranks (docs in closed_form.h).
double PrimerBytes(const OpShape& shape, int nranks);

absl::StatusOr<Choice> Tune(const OpShape& shape, const CommLayout& layout,
                            const topology::FabricSpec& fabric, const TunerOptions& options);

// The fabric a live communicator runs on: its nodes and rails, the largest node's rank count,
// and the calibrated link classes.
topology::FabricSpec FabricForLayout(const CommLayout& layout, const topology::LinkClass& intra,
                                     const topology::LinkClass& inter, double overhead_s);

// Per communicator: Tune() with a bounded cache keyed by the shape. The daemon asks for every
// operation, so a cached choice is shared, not copied.
class Tuner {
 public:
  Tuner(CommLayout layout, topology::FabricSpec fabric, TunerOptions options = {});
  absl::StatusOr<std::shared_ptr<const Choice>> Choose(const OpShape& shape);
  const topology::FabricSpec& fabric() const { return fabric_; }
  const TunerOptions& options() const { return options_; }

 private:
  const CommLayout layout_;
  const topology::FabricSpec fabric_;
  const TunerOptions options_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const Choice>> cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard::scheduler::cost
