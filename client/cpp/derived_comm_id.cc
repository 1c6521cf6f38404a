#include "derived_comm_id.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace railyard::internal {
namespace {

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

}  // namespace

std::string DerivedCommId(absl::string_view parent, absl::string_view salt,
                          absl::string_view coordinator) {
  if (coordinator.empty()) {
    const size_t at = parent.find('@');
    coordinator = at == absl::string_view::npos ? absl::string_view() : parent.substr(at + 1);
  }
  const std::string what = absl::StrCat(parent, "/", salt);
  return absl::StrCat("ry1-",
                      absl::StrFormat("%016x%016x", Fnv(what, 0xcbf29ce484222325ull),
                                      Fnv(what, 0x84222325cbf29ce4ull)),
                      "@", coordinator);
}

}  // namespace railyard::internal
