// CRC-32C (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41, reflected 0x82F63B78), the
// data plane's end-to-end check of every chunk when a communicator runs with integrity
// "crc32c" (daemon/transport/framed_endpoint.h).
//
// On x86-64 with SSE4.2 (detected at run time) it uses the crc32 instruction over three
// interleaved streams whose CRCs are combined with precomputed shift tables: the instruction
// has a latency of 3 cycles and a throughput of 1 per cycle, so one dependent stream runs at a
// third of what the core can do. Elsewhere, a slicing-by-8 table. Both give identical results
// (tests/unit/kernels_test.cc checks the known vectors and each against the other).
#pragma once

#include <cstddef>
#include <cstdint>

namespace railyard::transport {

// CRC-32C of [data, data + size), continuing from crc (the CRC of the bytes before; 0 to start):
// Crc32c(ab) == Crc32c(b, Crc32c(a)). Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

// The implementations behind Crc32c, for tests and benchmarks.
uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc = 0);
// One stream of the crc32 instruction (no interleaving). Requires Crc32cHardwareAvailable().
uint32_t Crc32cHardwareSimple(const void* data, size_t size, uint32_t crc = 0);
// Three interleaved streams. Requires Crc32cHardwareAvailable().
uint32_t Crc32cHardware(const void* data, size_t size, uint32_t crc = 0);
// Whether this CPU has SSE4.2's crc32 (always false off x86-64).
bool Crc32cHardwareAvailable();

}  // namespace railyard::transport
