#include "daemon/comm/residual_store.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace railyard {

absl::StatusOr<float*> ResidualStore::Get(uint64_t key, const kernels::Codec& codec, uint64_t elems,
                                          std::shared_ptr<QuotaAccount> quota) {
  const std::string name = kernels::CodecName(codec);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.codec == name && it->second.residual.size() == elems) {
    return it->second.residual.data();
  }
  QuotaCharge charge;
  if (absl::Status s = QuotaCharge::Take(std::move(quota), Resource::kResidualBytes,
                                         elems * sizeof(float), &charge);
      !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("error feedback for compression_key ", key, " needs ",
                                     elems * sizeof(float), " bytes of residual: ", s.message()));
  }
  Entry& e = entries_[key];  // the old residual (and its charge) goes, the new one takes its place
  e.codec = name;
  e.residual.assign(elems, 0.f);
  e.charge = std::move(charge);
  return e.residual.data();
}

}  // namespace railyard
