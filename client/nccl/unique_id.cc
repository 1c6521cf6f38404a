#include "client/nccl/unique_id.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace railyard::nccl {
namespace {

constexpr char kMagic[8] = {'R', 'Y', 'N', 'C', 'C', 'L', '1', '\0'};

// 128 bits from two FNV-1a-64 runs with different bases, each finished by splitmix64: the nonce
// of a derived id (not a secret: the parent's nonce is random and the job's token guards it).
uint64_t Mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Fnv(absl::string_view s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return Mix(h);
}

std::string Nonce(absl::string_view what) {
  return absl::StrFormat("%016x%016x", Fnv(what, 0xcbf29ce484222325ull),
                         Fnv(what, 0x84222325cbf29ce4ull));
}

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

std::string DerivedCommId(absl::string_view parent, absl::string_view salt) {
  const size_t at = parent.find('@');
  const absl::string_view coordinator =
      at == absl::string_view::npos ? absl::string_view() : parent.substr(at + 1);
  return absl::StrCat("ry1-", Nonce(absl::StrCat(parent, "/", salt)), "@", coordinator);
}

std::string CommIdAt(absl::string_view coordinator, absl::string_view job) {
  return absl::StrCat("ry1-", Nonce(absl::StrCat("NCCL_COMM_ID/", job, "/", coordinator)), "@",
                      coordinator);
}

}  // namespace railyard::nccl
