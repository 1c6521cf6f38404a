// Comm ids every member derives alike from a parent's, without exchanging one: the children of
// split, shrink and grow (the C++ client's Comm::Shrink/Grow, the Python client's, and
// libnccl's ncclCommSplit/Shrink). The same function in Python: railyard/_comm_ids.py.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace railyard::internal {

// "ry1-<32 hex>@<the parent's coordinator>": the nonce hashes (parent, salt) with two FNV-1a-64
// runs of different bases, each finished by splitmix64 (not a secret: the parent's nonce is
// random, and the job's token guards who may join). A non-empty coordinator replaces the
// parent's (a shrink after the parent's coordinator node was lost: Local.CommCensus).
std::string DerivedCommId(absl::string_view parent, absl::string_view salt,
                          absl::string_view coordinator = {});

}  // namespace railyard::internal
