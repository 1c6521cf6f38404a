// The algorithm table (UCC style: {name, description} plus the ops each one implements). Generate()
// dispatches through it; RAILYARD_ALGO / --algo take these names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/scheduler/algorithms/builder.h"
#include "daemon/scheduler/op.h"

namespace railyard::scheduler::algorithms {

constexpr uint32_t OpBit(OpKind op) { return uint32_t{1} << static_cast<uint32_t>(op); }

struct AlgorithmInfo {
  const char* name;
  const char* description;
  uint32_t ops;  // OpBit() of every op it implements
  // Emits the schedule of b.shape() on b.layout(); INVALID_ARGUMENT when the layout does not fit.
  absl::Status (*generate)(ScheduleBuilder& b);
};

// Every algorithm, in a fixed order.
const std::vector<AlgorithmInfo>& AlgorithmTable();
// nullptr when no algorithm has that name.
const AlgorithmInfo* FindAlgorithm(absl::string_view name);
inline bool Implements(const AlgorithmInfo& algo, OpKind op) { return (algo.ops & OpBit(op)) != 0; }
// Names of the algorithms implementing op, comma separated ("direct, hier").
std::string AlgorithmsFor(OpKind op);
// True for the names RAILYARD_ALGO and --algo take: the table's and "local" (kAlgoLocal).
bool IsAlgorithmName(absl::string_view name);
// Those names, '|' separated, for messages ("local|ring|tree|...").
std::string AlgorithmNames();

}  // namespace railyard::scheduler::algorithms
