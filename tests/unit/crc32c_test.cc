// Tests for CRC-32C (daemon/transport/crc32c.h): the published check values, and the hardware
// implementations (one stream and three interleaved) against the portable table on random data
// at every alignment and across the block boundaries of the interleaving.

#include "daemon/transport/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace railyard::transport {
namespace {

struct Vector {
  std::string data;
  uint32_t crc;
};

// RFC 3720 B.4 (iSCSI) and the common "123456789" check value.
std::vector<Vector> KnownVectors() {
  return {
      {"", 0x00000000},
      {"a", 0xC1D04330},
      {"123456789", 0xE3069283},
      {std::string(32, '\0'), 0x8A9136AA},
      {std::string(32, '\xff'), 0x62A8AB43},
  };
}

std::string Ascending32() {
  std::string s;
  for (int i = 0; i < 32; ++i) s.push_back(static_cast<char>(i));
  return s;
}

TEST(Crc32cTest, KnownVectors) {
  std::vector<Vector> vectors = KnownVectors();
  vectors.push_back({Ascending32(), 0x46DD794E});
  for (const Vector& v : vectors) {
    EXPECT_EQ(Crc32c(v.data.data(), v.data.size()), v.crc) << "length " << v.data.size();
    EXPECT_EQ(Crc32cPortable(v.data.data(), v.data.size()), v.crc) << "length " << v.data.size();
    if (Crc32cHardwareAvailable()) {
      EXPECT_EQ(Crc32cHardwareSimple(v.data.data(), v.data.size()), v.crc);
      EXPECT_EQ(Crc32cHardware(v.data.data(), v.data.size()), v.crc);
    }
  }
}

TEST(Crc32cTest, ContinuesFromAPreviousCrc) {
  const std::string s = "123456789";
  for (size_t split = 0; split <= s.size(); ++split) {
    const uint32_t head = Crc32c(s.data(), split);
    EXPECT_EQ(Crc32c(s.data() + split, s.size() - split, head), 0xE3069283u) << split;
    EXPECT_EQ(Crc32cPortable(s.data() + split, s.size() - split, head), 0xE3069283u) << split;
  }
}

TEST(Crc32cTest, HardwareMatchesPortableOnRandomData) {
  if (!Crc32cHardwareAvailable()) GTEST_SKIP() << "no SSE4.2 crc32 on this CPU";
  std::mt19937_64 rng(20240611);
  std::vector<unsigned char> buffer((1 << 20) + 64);
  for (auto& b : buffer) b = static_cast<unsigned char>(rng());
  // Lengths around the interleaving's block sizes (3 x 256, 3 x 8192) and random ones.
  std::vector<size_t> lengths = {0,    1,     7,     8,     9,     767,   768,    769,
                                 1023, 24575, 24576, 24577, 49152, 65536, 1 << 20};
  for (int i = 0; i < 300; ++i) lengths.push_back(rng() % 100000);
  for (size_t length : lengths) {
    for (size_t offset = 0; offset < 16; ++offset) {
      if (offset + length > buffer.size()) continue;
      const unsigned char* p = buffer.data() + offset;
      const uint32_t seed = static_cast<uint32_t>(rng());
      const uint32_t want = Crc32cPortable(p, length, seed);
      ASSERT_EQ(Crc32cHardware(p, length, seed), want)
          << "length " << length << " offset " << offset;
      ASSERT_EQ(Crc32cHardwareSimple(p, length, seed), want)
          << "length " << length << " offset " << offset;
      ASSERT_EQ(Crc32c(p, length, seed), want);
    }
  }
}

TEST(Crc32cTest, EverySingleBitFlipChangesTheCrc) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> data(4096);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  const uint32_t clean = Crc32c(data.data(), data.size());
  for (size_t bit = 0; bit < data.size() * 8; ++bit) {
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    ASSERT_NE(Crc32c(data.data(), data.size()), clean) << "bit " << bit;
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
}

}  // namespace
}  // namespace railyard::transport
