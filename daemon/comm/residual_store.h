// Error-feedback residuals of one communicator (docs/compression.md): per key (a tensor or bucket
// that recurs across iterations, named by the client), what the codec dropped last time, added
// to the next operation of that key before it is encoded. Charged to the submitting session's
// quota (Resource::kResidualBytes, --max_residual_bytes_per_{session,job}) and released with the
// communicator. Not thread-safe: the communicator serialises access, and runs one collective at a
// time, so a residual is never used by two operations at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/kernels/codec.h"
#include "daemon/session/quota.h"

namespace railyard {

class ResidualStore {
 public:
  // The residual of key for an operation of `elems` float32 elements under codec, zeroed when
  // the key is new or last ran with another element count or codec (a different tensor under the
  // same key: its residual means nothing here). New bytes are charged to quota (may be null);
  // RESOURCE_EXHAUSTED naming the limit when that would pass it, and nothing changes. The
  // pointer stays valid until the next Get of the same key or the store's end.
  absl::StatusOr<float*> Get(uint64_t key, const kernels::Codec& codec, uint64_t elems,
                             std::shared_ptr<QuotaAccount> quota);

 private:
  struct Entry {
    std::string codec;
    std::vector<float> residual;
    QuotaCharge charge;
  };
  std::map<uint64_t, Entry> entries_;
};

}  // namespace railyard
