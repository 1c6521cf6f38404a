#include "daemon/util/random_id.h"

#include <random>

#include "absl/strings/str_format.h"

namespace railyard {

std::string RandomHex128() {
  static thread_local std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

uint64_t RandomNonZero64() {
  static thread_local std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) | rd();
  return v;
}

}  // namespace railyard
