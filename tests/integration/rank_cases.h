// The correctness matrix one test rank runs: every collective x dtypes x redops x odd counts,
// in place and out of place. Each rank computes every other rank's input from a formula, so it
// can check its own output exactly (byte for byte).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "railyard/client.h"

namespace railyard::testing {

enum class CaseOp {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kAllToAllv,
  kSendRecv,
  kBarrier,
};

struct Case {
  CaseOp op;
  DataType dtype;
  RedOp red_op;
  uint64_t count;
  bool in_place;
  int root;
  std::string Describe() const;
};

// The matrix for a communicator of nranks ranks (on one daemon or several).
std::vector<Case> AllCases(int nranks);

// Bytes the scratch buffer must have to run every case of AllCases(nranks).
size_t ScratchBytes(int nranks);

// Runs one case on comm using buf as scratch; returns the number of wrong elements, or an error
// when the operation itself failed.
absl::StatusOr<uint64_t> RunCase(Comm& comm, Buffer& buf, const Case& c);

}  // namespace railyard::testing
