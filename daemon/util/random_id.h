// Random identifiers drawn from the OS (getrandom / /dev/urandom): session ids, side-channel
// tickets, comm id nonces, communicators' data secrets. Each is a capability, so every bit is
// random.
#pragma once

#include <cstdint>
#include <string>

namespace railyard {

// 128 random bits as 32 lowercase hex digits.
std::string RandomHex128();
// 64 random bits, never 0 (a communicator's data secret).
uint64_t RandomNonZero64();

}  // namespace railyard
