#include "daemon/transport/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace railyard::transport {
namespace {

constexpr uint32_t kPoly = 0x82F63B78;  // reflected 0x1EDC6F41

// Slicing-by-8 tables: table[k][b] is the CRC state of byte b followed by k zero bytes.
struct PortableTables {
  uint32_t t[8][256];
  PortableTables() {
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = t[0][n];
      for (int k = 1; k < 8; ++k) {
        c = t[0][c & 0xff] ^ (c >> 8);
        t[k][n] = c;
      }
    }
  }
};

const PortableTables& Tables() {
  static const PortableTables tables;
  return tables;
}

}  // namespace

uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc) {
  const auto& t = Tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (size > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    --size;
  }
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian hosts only (x86-64, aarch64 as built here)
    word ^= c;
    c = t[7][word & 0xff] ^ t[6][(word >> 8) & 0xff] ^ t[5][(word >> 16) & 0xff] ^
        t[4][(word >> 24) & 0xff] ^ t[3][(word >> 32) & 0xff] ^ t[2][(word >> 40) & 0xff] ^
        t[1][(word >> 48) & 0xff] ^ t[0][word >> 56];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__)
namespace {

// Block lengths of the three interleaved streams: long blocks for bulk data, short ones for the
// tail, so that a message of a few KiB still runs interleaved.
constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

// GF(2) 32x32 matrices (column n = the image of bit n), to build the operator that appends
// `len` zero bytes to a CRC state (as in zlib's crc32_combine).
uint32_t MatrixTimes(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++mat) {
    if (vec & 1) sum ^= *mat;
  }
  return sum;
}

void MatrixSquare(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = MatrixTimes(mat, mat[n]);
}

// Table form of "shift a CRC state over len zero bytes": four byte-indexed lookups.
struct ShiftTable {
  uint32_t t[4][256];
  explicit ShiftTable(size_t len) {
    uint32_t op[32], sq[32];
    // One zero bit.
    op[0] = kPoly;
    for (int n = 1; n < 32; ++n) op[n] = uint32_t{1} << (n - 1);
    // Square three times: one zero byte.
    for (int i = 0; i < 3; ++i) {
      MatrixSquare(sq, op);
      std::memcpy(op, sq, sizeof(op));
    }
    // op = one zero byte; compose the powers of two present in len.
    uint32_t result[32];
    bool have = false;
    for (size_t l = len; l != 0; l >>= 1) {
      if (l & 1) {
        if (!have) {
          std::memcpy(result, op, sizeof(result));
          have = true;
        } else {
          uint32_t composed[32];
          for (int n = 0; n < 32; ++n) composed[n] = MatrixTimes(op, result[n]);
          std::memcpy(result, composed, sizeof(result));
        }
      }
      MatrixSquare(sq, op);
      std::memcpy(op, sq, sizeof(op));
    }
    for (uint32_t n = 0; n < 256; ++n) {
      for (int k = 0; k < 4; ++k) t[k][n] = MatrixTimes(result, n << (8 * k));
    }
  }
  uint32_t Shift(uint32_t crc) const {
    return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
  }
};

const ShiftTable& LongShift() {
  static const ShiftTable table(kLong);
  return table;
}
const ShiftTable& ShortShift() {
  static const ShiftTable table(kShort);
  return table;
}

__attribute__((target("sse4.2"))) uint64_t Word(const unsigned char* p) {
  uint64_t word;
  std::memcpy(&word, p, 8);
  return word;
}

// Runs `block` bytes in each of three streams while at least 3 * block remain.
__attribute__((target("sse4.2"))) uint64_t Interleave(const unsigned char*& p, size_t& size,
                                                      uint64_t c0, size_t block,
                                                      const ShiftTable& shift) {
  while (size >= 3 * block) {
    uint64_t c1 = 0, c2 = 0;
    const unsigned char* end = p + block;
    do {
      c0 = _mm_crc32_u64(c0, Word(p));
      c1 = _mm_crc32_u64(c1, Word(p + block));
      c2 = _mm_crc32_u64(c2, Word(p + 2 * block));
      p += 8;
    } while (p < end);
    c0 = shift.Shift(static_cast<uint32_t>(c0)) ^ c1;
    c0 = shift.Shift(static_cast<uint32_t>(c0)) ^ c2;
    p += 2 * block;
    size -= 3 * block;
  }
  return c0;
}

__attribute__((target("sse4.2"))) uint32_t Hardware(const void* data, size_t size, uint32_t crc,
                                                    bool interleave) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (size > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --size;
  }
  if (interleave) {
    c = Interleave(p, size, c, kLong, LongShift());
    c = Interleave(p, size, c, kShort, ShortShift());
  }
  while (size >= 8) {
    c = _mm_crc32_u64(c, Word(p));
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
}

}  // namespace

bool Crc32cHardwareAvailable() {
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
}
uint32_t Crc32cHardwareSimple(const void* data, size_t size, uint32_t crc) {
  return Hardware(data, size, crc, /*interleave=*/false);
}
uint32_t Crc32cHardware(const void* data, size_t size, uint32_t crc) {
  return Hardware(data, size, crc, /*interleave=*/true);
}
uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  return Crc32cHardwareAvailable() ? Crc32cHardware(data, size, crc)
                                   : Crc32cPortable(data, size, crc);
}
#else
bool Crc32cHardwareAvailable() { return false; }
uint32_t Crc32cHardwareSimple(const void* data, size_t size, uint32_t crc) {
  return Crc32cPortable(data, size, crc);
}
uint32_t Crc32cHardware(const void* data, size_t size, uint32_t crc) {
  return Crc32cPortable(data, size, crc);
}
uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  return Crc32cPortable(data, size, crc);
}
#endif

}  // namespace railyard::transport
