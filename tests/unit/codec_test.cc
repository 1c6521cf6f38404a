// The wire codecs (daemon/kernels/codec.h): sizes, round trips, the documented error bounds,
// NaN/inf, odd sizes, malformed input from a peer, and the error-feedback identity.
#include "daemon/kernels/codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "daemon/kernels/reduce.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard::kernels {
namespace {

using ::testing::HasSubstr;

Codec Parsed(const char* text) {
  absl::StatusOr<Codec> c = ParseCodec(text);
  EXPECT_TRUE(c.ok()) << text << ": " << c.status();
  return c.ok() ? *c : Codec();
}

std::vector<float> Gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint8_t> Encoded(const Codec& c, const std::vector<float>& x) {
  std::vector<uint8_t> out(EncodedBytes(c, x.size()));
  EXPECT_EQ(Encode(c, x.data(), x.size(), out.data()), out.size());
  return out;
}

std::vector<float> RoundTrip(const Codec& c, const std::vector<float>& x) {
  const std::vector<uint8_t> wire = Encoded(c, x);
  std::vector<float> back(x.size(), -1.0f);
  const absl::Status s = Decode(c, wire.data(), wire.size(), x.size(), back.data());
  EXPECT_TRUE(s.ok()) << s;
  return back;
}

TEST(CodecTest, ParsesEveryFormAndNamesItBack) {
  for (const char* text : {"none", "fp16", "bf16", "int8", "int8:64", "topk:0.01", "topk:1"}) {
    EXPECT_EQ(CodecName(Parsed(text)), text);
  }
  EXPECT_EQ(Parsed("int8").block, 128u);
  EXPECT_EQ(Parsed("int8:32").block, 32u);
  EXPECT_DOUBLE_EQ(Parsed("topk:1%").topk_ratio, 0.01);
  EXPECT_DOUBLE_EQ(Parsed("topk:0.1%").topk_ratio, 0.001);
  struct Bad {
    const char* text;
    const char* says;
  };
  for (const Bad& b : std::vector<Bad>{{"", "is not a codec"},
                                       {"gzip", "is not a codec"},
                                       {"FP16", "is not a codec"},
                                       {"int8:", "block size"},
                                       {"int8:4", "block size"},
                                       {"int8:70000", "block size"},
                                       {"int8:int8", "block size"},
                                       {"int8:-8", "block size"},
                                       {"topk:", "not a number"},
                                       {"topk:x", "not a number"},
                                       {"topk:nan", "not a number"},
                                       {"topk:0", "outside (0, 1]"},
                                       {"topk:1.5", "outside (0, 1]"},
                                       {"topk:-0.1", "outside (0, 1]"},
                                       {"topk:200%", "outside (0, 1]"}}) {
    absl::StatusOr<Codec> c = ParseCodec(b.text);
    ASSERT_FALSE(c.ok()) << b.text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << b.text;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(b.says)) << b.text;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("accepted: none, fp16")) << b.text;
  }
}

TEST(CodecTest, WireSizesAndRatiosAreTheDocumentedOnes) {
  const size_t d = 1 << 20;
  EXPECT_EQ(EncodedBytes(Parsed("none"), d), 4 * d);
  EXPECT_DOUBLE_EQ(CompressionRatio(Parsed("fp16"), d), 2.0);
  EXPECT_DOUBLE_EQ(CompressionRatio(Parsed("bf16"), d), 2.0);
  // d + 4d/b bytes: 3.88x for b = 128.
  EXPECT_EQ(EncodedBytes(Parsed("int8"), d), d + 4 * d / 128);
  EXPECT_NEAR(CompressionRatio(Parsed("int8"), d), 3.879, 0.001);
  EXPECT_EQ(EncodedBytes(Parsed("int8"), 129), 129u + 8u);  // a partial last block has a scale
  // d / 2K: K = 0.001 d gives 500x, not 1000x.
  const size_t d2 = 1'000'000;
  EXPECT_EQ(TopKCount(Parsed("topk:0.001"), d2), 1000u);
  EXPECT_DOUBLE_EQ(CompressionRatio(Parsed("topk:0.001"), d2), 500.0);
  // 0.01 * 300 is 3.0000000000000004 in binary: still 3, not 4; a fraction rounds up; at least 1.
  EXPECT_EQ(TopKCount(Parsed("topk:0.01"), 300), 3u);
  EXPECT_EQ(TopKCount(Parsed("topk:0.01"), 301), 4u);
  EXPECT_EQ(TopKCount(Parsed("topk:0.001"), 5), 1u);
  EXPECT_EQ(TopKCount(Parsed("topk:1"), 7), 7u);
  EXPECT_EQ(TopKCount(Parsed("topk:0.5"), 0), 0u);
  EXPECT_EQ(EncodedBytes(Parsed("topk:0.5"), 0), 0u);
}

TEST(CodecTest, HalfCastsRoundTripLikeTheScalarConversions) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{10007}}) {
    std::vector<float> x = Gaussian(n, 7 + n, 100.0f);
    if (n > 3) {
      x[0] = 1e6f;  // past fp16's 65504: +inf there, finite in bf16
      x[1] = std::numeric_limits<float>::quiet_NaN();
      x[2] = 1e-8f;  // an fp16 subnormal
    }
    const std::vector<float> h = RoundTrip(Parsed("fp16"), x);
    const std::vector<float> b = RoundTrip(Parsed("bf16"), x);
    for (size_t i = 0; i < n; ++i) {
      const float want_h = HalfToFloat(FloatToHalf(x[i]));
      const float want_b = BFloat16ToFloat(FloatToBFloat16(x[i]));
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(h[i]) && std::isnan(b[i])) << i;
        continue;
      }
      EXPECT_EQ(h[i], want_h) << i;
      EXPECT_EQ(b[i], want_b) << i;
      // Round to nearest: half an ulp of 11 (fp16) or 8 (bf16) significant bits.
      if (std::isfinite(h[i]) && std::fabs(x[i]) > 6.2e-5f) {
        EXPECT_LE(std::fabs(h[i] - x[i]), std::fabs(x[i]) * 0x1p-11f) << i;
      }
      EXPECT_LE(std::fabs(b[i] - x[i]), std::fabs(x[i]) * 0x1p-8f) << i;
    }
    if (n > 3) {
      EXPECT_EQ(h[0], std::numeric_limits<float>::infinity());
      EXPECT_TRUE(std::isfinite(b[0]));
    }
  }
}

TEST(CodecTest, Int8ErrorIsAtMostHalfAScalePerElement) {
  for (const char* text : {"int8", "int8:8", "int8:1000"}) {
    const Codec c = Parsed(text);
    for (size_t n : {size_t{1}, size_t{7}, size_t{128}, size_t{129}, size_t{5000}, size_t{65537}}) {
      std::vector<float> x = Gaussian(n, static_cast<uint32_t>(n), 3.0f);
      if (n >= 2 * c.block) std::fill(x.begin() + c.block, x.begin() + 2 * c.block, 0.0f);
      const std::vector<uint8_t> wire = Encoded(c, x);
      const std::vector<float> y = RoundTrip(c, x);
      for (size_t b = 0; b * c.block < n; ++b) {
        float scale;
        std::memcpy(&scale, wire.data() + 4 * b, 4);
        float m = 0;
        for (size_t i = b * c.block; i < std::min(n, (b + 1) * c.block); ++i) {
          m = std::max(m, std::fabs(x[i]));
        }
        EXPECT_EQ(scale, m / 127.0f) << text << " block " << b;
        for (size_t i = b * c.block; i < std::min(n, (b + 1) * c.block); ++i) {
          // scale / 2, plus the float32 roundings of x * (127 / m) and q * scale.
          EXPECT_LE(std::fabs(y[i] - x[i]), scale * 0.5f * (1 + 1e-5f) + std::fabs(x[i]) * 1e-6f)
              << text << " n " << n << " i " << i;
        }
      }
      if (n >= 2 * c.block) {
        for (size_t i = c.block; i < 2 * c.block; ++i) ASSERT_EQ(y[i], 0.0f) << i;  // a zero block
      }
    }
  }
}

TEST(CodecTest, AnInt8BlockWithNanOrInfDecodesToNanAndSparesTheOthers) {
  const Codec c = Parsed("int8:8");
  std::vector<float> x = Gaussian(32, 3);
  x[3] = std::numeric_limits<float>::infinity();
  x[17] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> y = RoundTrip(c, x);
  for (size_t i = 0; i < 32; ++i) {
    const bool poisoned = (i / 8 == 0) || (i / 8 == 2);
    EXPECT_EQ(std::isnan(y[i]), poisoned) << i;
    if (!poisoned) {
      EXPECT_NEAR(y[i], x[i], 0.05f) << i;
    }
  }
}

TEST(CodecTest, TopKKeepsTheLargestMagnitudesNanFirstTiesToTheLowerIndex) {
  const Codec c = Parsed("topk:0.25");  // K = 4 of 16
  std::vector<float> x(16, 1.0f);       // all tied at 1 but those set below
  x[9] = -8.0f;
  x[2] = 5.0f;
  x[14] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<uint8_t> wire = Encoded(c, x);
  ASSERT_EQ(wire.size(), 32u);
  uint32_t idx[4];
  std::memcpy(idx, wire.data(), 16);
  EXPECT_THAT(idx, ::testing::ElementsAre(0, 2, 9, 14));  // the 1.0 tie goes to index 0
  const std::vector<float> y = RoundTrip(c, x);
  for (size_t i = 0; i < 16; ++i) {
    if (i == 0 || i == 2 || i == 9) {
      EXPECT_EQ(y[i], x[i]) << i;
    } else if (i == 14) {
      EXPECT_TRUE(std::isnan(y[i]));
    } else {
      EXPECT_EQ(y[i], 0.0f) << i;
    }
  }
  // On random data: exactly K kept, and none dropped is larger than one kept.
  const Codec one = Parsed("topk:1%");
  const std::vector<float> r = Gaussian(100'003, 11);
  const std::vector<float> ry = RoundTrip(one, r);
  float smallest_kept = INFINITY, largest_dropped = 0;
  size_t kept = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (ry[i] != 0.0f) {
      ++kept;
      EXPECT_EQ(ry[i], r[i]);
      smallest_kept = std::min(smallest_kept, std::fabs(r[i]));
    } else {
      largest_dropped = std::max(largest_dropped, std::fabs(r[i]));
    }
  }
  EXPECT_EQ(kept, TopKCount(one, r.size()));
  EXPECT_EQ(kept, 1001u);
  EXPECT_GE(smallest_kept, largest_dropped);
}

TEST(CodecTest, DecodeAddAccumulatesWhatDecodeWrites) {
  for (const char* text : {"none", "fp16", "bf16", "int8", "topk:0.1"}) {
    const Codec c = Parsed(text);
    const std::vector<float> x = Gaussian(1001, 5);
    const std::vector<uint8_t> wire = Encoded(c, x);
    std::vector<float> dense(x.size());
    ASSERT_TRUE(Decode(c, wire.data(), wire.size(), x.size(), dense.data()).ok());
    std::vector<float> acc(x.size(), 2.0f);
    ASSERT_TRUE(DecodeAdd(c, wire.data(), wire.size(), x.size(), acc.data()).ok());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(acc[i], 2.0f + dense[i]) << text << " " << i;
  }
}

// A peer's bytes are untrusted: each malformed encoding is refused by name, the accumulator keeps
// its values, and nothing past the n elements is written (guards around the output).
TEST(CodecTest, MalformedEncodingsAreRefusedWithoutTouchingTheAccumulator) {
  constexpr size_t n = 64;
  const std::vector<float> x = Gaussian(n, 9);
  struct Case {
    const char* codec;
    size_t bytes_delta;  // added to the right length (wraps for "less")
    void (*spoil)(std::vector<uint8_t>&);
    const char* says;
  };
  const std::vector<Case> cases = {
      {"fp16", size_t(-1), nullptr, "127 bytes for 64 elements, which take 128"},
      {"int8:8", 1, nullptr, "97 bytes for 64 elements, which take 96"},
      {"topk:0.125", size_t(-8), nullptr, "56 bytes for 64 elements, which take 64"},
      {"none", 4, nullptr, "260 bytes for 64 elements, which take 256"},
      {"int8:8", 0,
       [](std::vector<uint8_t>& w) {
         const float s = -1.0f;
         std::memcpy(w.data() + 4 * 3, &s, 4);
       },
       "the scale of block 3 is -1"},
      {"int8:8", 0,
       [](std::vector<uint8_t>& w) {
         const float s = std::numeric_limits<float>::infinity();
         std::memcpy(w.data(), &s, 4);
       },
       "the scale of block 0 is inf"},
      {"topk:0.125", 0,
       [](std::vector<uint8_t>& w) {
         const uint32_t i = 64;
         std::memcpy(w.data() + 4 * 7, &i, 4);
       },
       "index 7 is 64, past the 64 elements"},
      {"topk:0.125", 0,
       [](std::vector<uint8_t>& w) {
         const uint32_t i = 0xFFFFFFFFu;
         std::memcpy(w.data() + 4 * 2, &i, 4);
       },
       "index 2 is 4294967295"},
      {"topk:0.125", 0,
       [](std::vector<uint8_t>& w) { std::memcpy(w.data() + 4, w.data(), 4); },  // a repeat
       "index 1 ("},
  };
  for (const Case& k : cases) {
    const Codec c = Parsed(k.codec);
    std::vector<uint8_t> wire = Encoded(c, x);
    wire.resize(wire.size() + k.bytes_delta);
    if (k.spoil != nullptr) k.spoil(wire);
    std::vector<float> guarded(n + 16, 7.0f);
    const absl::Status add = DecodeAdd(c, wire.data(), wire.size(), n, guarded.data() + 8);
    EXPECT_EQ(add.code(), absl::StatusCode::kInvalidArgument) << k.codec << ": " << add;
    EXPECT_THAT(std::string(add.message()), HasSubstr(k.says)) << k.codec;
    for (float v : guarded) ASSERT_EQ(v, 7.0f) << k.codec << ": the accumulator changed";
    const absl::Status dec = Decode(c, wire.data(), wire.size(), n, guarded.data() + 8);
    EXPECT_EQ(dec.code(), absl::StatusCode::kInvalidArgument) << k.codec;
    for (size_t i = 0; i < 8; ++i) {
      ASSERT_EQ(guarded[i], 7.0f);
      ASSERT_EQ(guarded[n + 8 + i], 7.0f);
    }
  }
  // Random bytes of the right length: accepted or refused, never out of bounds (ASan runs this).
  std::mt19937 rng(1);
  for (const char* text : {"int8:8", "topk:0.25", "fp16"}) {
    const Codec c = Parsed(text);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<uint8_t> wire(EncodedBytes(c, n));
      for (uint8_t& b : wire) b = static_cast<uint8_t>(rng());
      std::vector<float> guarded(n + 16, 7.0f);
      const absl::Status s = Decode(c, wire.data(), wire.size(), n, guarded.data() + 8);
      EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kInvalidArgument) << s;
      for (size_t i = 0; i < 8; ++i) {
        ASSERT_EQ(guarded[i], 7.0f);
        ASSERT_EQ(guarded[n + 8 + i], 7.0f);
      }
    }
  }
}

// v = C(g + e), e <- g + e - D(v): at every step D(v) + e_new is exactly fl(g + e_old), and
// over K steps sum D(v_k) = sum g_k + e_1 - e_{K+1} up to the roundings of g + e.
TEST(CodecTest, ErrorFeedbackCarriesWhatWasNotSentExactly) {
  constexpr size_t n = 777;
  constexpr int kSteps = 300;
  for (const char* text : {"fp16", "bf16", "int8", "int8:16", "topk:0.01", "topk:0.3"}) {
    const Codec c = Parsed(text);
    std::vector<float> e(n, 0.0f);
    std::vector<double> sent(n, 0.0), truth(n, 0.0), rounding(n, 0.0);
    std::vector<uint8_t> wire(EncodedBytes(c, n));
    std::vector<float> d(n);
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<float> g = Gaussian(n, 1000 + step, 0.01f);
      std::vector<float> u(n);
      for (size_t i = 0; i < n; ++i) {
        u[i] = g[i] + e[i];
        rounding[i] += std::fabs(static_cast<double>(u[i]) - (double(g[i]) + double(e[i])));
      }
      ASSERT_EQ(EncodeWithFeedback(c, g.data(), e.data(), n, wire.data()), wire.size());
      ASSERT_TRUE(Decode(c, wire.data(), wire.size(), n, d.data()).ok());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(d[i] + e[i], u[i]) << text << " step " << step << " i " << i;
        ASSERT_EQ(static_cast<double>(d[i]) + static_cast<double>(e[i]), static_cast<double>(u[i]))
            << "the subtraction was not exact";
        sent[i] += d[i];
        truth[i] += g[i];
      }
    }
    for (size_t i = 0; i < n; ++i) {
      // e_1 = 0: sum sent = sum g - e_{K+1}, within the accumulated roundings of g + e.
      EXPECT_NEAR(sent[i], truth[i] - e[i], rounding[i] + 1e-12) << text << " i " << i;
    }
  }
  // top-k: what was not sent stays in the residual untouched; what was sent leaves none.
  const Codec c = Parsed("topk:0.25");
  std::vector<float> g = {4, 1, -3, 0.5f, 2, -6, 0.25f, 1.5f};
  std::vector<float> e(8, 0.0f);
  std::vector<uint8_t> wire(EncodedBytes(c, 8));
  EncodeWithFeedback(c, g.data(), e.data(), 8, wire.data());
  EXPECT_THAT(e, ::testing::ElementsAre(0, 1, -3, 0.5f, 2, 0, 0.25f, 1.5f));
  // u = {4, 2, -6, 1, 4, -6, 0.5, 3}: the two 6s go (a tie, both kept), the rest accumulates.
  EncodeWithFeedback(c, g.data(), e.data(), 8, wire.data());
  EXPECT_THAT(e, ::testing::ElementsAre(4, 2, 0, 1, 4, 0, 0.5f, 3));
}

TEST(CodecTest, ANonFiniteDecodedElementLeavesNoResidual) {
  const Codec c = Parsed("fp16");
  std::vector<float> g = {1e6f, 1.0f, std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> e(3, 0.0f);
  std::vector<uint8_t> wire(EncodedBytes(c, 3));
  EncodeWithFeedback(c, g.data(), e.data(), 3, wire.data());
  EXPECT_EQ(e[0], 0.0f);  // sent as +inf: no -inf kept for the next step
  EXPECT_EQ(e[1], 0.0f);  // 1.0 is exact in fp16
  EXPECT_EQ(e[2], 0.0f);
}

}  // namespace
}  // namespace railyard::kernels
