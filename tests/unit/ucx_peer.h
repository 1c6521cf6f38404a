// What transport_test and its spawned peer program (ucx_peer_main.cc) agree on.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace railyard::testing {

inline constexpr char kUcxPeerInEnv[] = "RAILYARD_TRANSPORT_TEST_PEER_IN";
inline constexpr char kUcxPeerOutEnv[] = "RAILYARD_TRANSPORT_TEST_PEER_OUT";
inline constexpr size_t kUcxPeerBytes = size_t{1} << 20;

// Deterministic bytes from seed (xorshift64).
inline void FillPattern(std::vector<uint8_t>& buf, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint8_t& b : buf) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
}

// The test and its peer talk over pipes a line at a time. ReadLine stops at '\n' or EOF.
inline std::string ReadLine(int fd) {
  std::string line;
  char ch;
  while (read(fd, &ch, 1) == 1 && ch != '\n') line.push_back(ch);
  return line;
}

inline bool WriteLine(int fd, const std::string& line) {
  const std::string data = line + "\n";
  return write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
}

}  // namespace railyard::testing
