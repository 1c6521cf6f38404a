#include "client/nccl/unique_id.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/cpp/derived_comm_id.h"

namespace railyard::nccl {
namespace {

constexpr char kMagic[8] = {'R', 'Y', 'N', 'C', 'C', 'L', '1', '\0'};

}  // namespace

absl::StatusOr<ncclUniqueId> EncodeUniqueId(absl::string_view comm_id) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (comm_id.size() + sizeof(kMagic) + 1 > sizeof(id.internal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm id '", comm_id, "' does not fit NCCL's ", NCCL_UNIQUE_ID_BYTES,
                     "-byte unique id: give the coordinating railyardd a shorter --peer_listen"));
  }
  std::memcpy(id.internal, kMagic, sizeof(kMagic));
  std::memcpy(id.internal + sizeof(kMagic), comm_id.data(), comm_id.size());
  return id;
}

absl::StatusOr<std::string> DecodeUniqueId(const ncclUniqueId& id) {
  if (std::memcmp(id.internal, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        "unique id was not made by railyard's ncclGetUniqueId (or NCCL_COMM_ID): another "
        "NCCL's, uninitialised or corrupted");
  }
  const char* text = id.internal + sizeof(kMagic);
  const size_t room = sizeof(id.internal) - sizeof(kMagic);
  const size_t len = strnlen(text, room);
  if (len == room || len == 0) {
    return absl::InvalidArgumentError("unique id is corrupted: its comm id is empty or unended");
  }
  return std::string(text, len);
}

std::string CommIdAt(absl::string_view coordinator, absl::string_view job) {
  // As derived from a parent "@<coordinator>" salted with the job: every rank alike.
  return internal::DerivedCommId(absl::StrCat("NCCL_COMM_ID@", coordinator),
                                 absl::StrCat("job/", job));
}

}  // namespace railyard::nccl
