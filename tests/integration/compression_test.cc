// Compressed AllReduce across three railyardd on loopback (docs/compression.md): results within
// each codec's documented bound and the same bits on every rank, the link counters showing the
// codec's ratio, error feedback under a compression_key, and the bad inputs refused.
#include <cmath>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/kernels/reduce.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_ranks.h"
#include "tests/integration/virtual_cluster.h"

namespace railyard::testing {
namespace {

using ::testing::HasSubstr;

// Rank r's element i: a smooth, signed pattern of a few magnitudes (not exact in any codec).
float Value(int rank, size_t i) {
  return std::sin(0.001f * static_cast<float>(i) + static_cast<float>(rank)) *
         (1.0f + static_cast<float>((i / 1000) % 7));
}

struct Totals {
  double link_tx = 0, uncompressed_tx = 0, compressed_tx = 0;
};
Totals Scrape(VirtualCluster& cluster) {
  Totals t;
  for (int n = 0; n < cluster.size(); ++n) {
    const std::string text = HttpGet(MetricsAddress(cluster[n]), "/metrics");
    EXPECT_THAT(text, HasSubstr("railyard_link_bytes_total{")) << cluster[n].Log();
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.find("direction=\"tx\"") == std::string::npos) continue;
      const double v = std::stod(line.substr(line.rfind(' ') + 1));
      if (line.rfind("railyard_link_bytes_total{", 0) == 0) t.link_tx += v;
      if (line.rfind("railyard_link_uncompressed_bytes_total{", 0) == 0) t.uncompressed_tx += v;
      if (line.rfind("railyard_link_compressed_bytes_total{", 0) == 0) t.compressed_tx += v;
    }
  }
  return t;
}

// One AllReduce (sum) of count floats by every rank; fills results[rank]. OK or the first error.
absl::Status AllReduceOnce(RankPerNode& ranks, size_t count, const CollectiveOptions& o,
                           std::vector<std::vector<float>>* results) {
  const int n = static_cast<int>(ranks.comms.size());
  std::vector<Work> w(n);
  for (int r = 0; r < n; ++r) {
    float* x = ranks.bufs[r].span<float>().data();
    for (size_t i = 0; i < count; ++i) x[i] = Value(r, i);
    w[r] = ranks.comms[r].AllReduce(ranks.bufs[r], ranks.bufs[r], count, DataType::kFloat32,
                                    RedOp::kSum, o);
  }
  absl::Status first;
  results->assign(n, {});
  for (int r = 0; r < n; ++r) {
    absl::Status s = w[r].wait(std::chrono::seconds(60));
    if (!s.ok() && first.ok()) first = s;
    const float* x = ranks.bufs[r].span<float>().data();
    (*results)[r].assign(x, x + count);
  }
  return first;
}

constexpr size_t kCount = size_t{1} << 18;  // 1 MiB of float32

TEST(CompressionTest, EveryCodecAcrossThreeDaemonsIsWithinItsBoundAndShrinksTheLinks) {
  VirtualCluster cluster(3, {"--metrics_listen=127.0.0.1:0"}, PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  RankPerNode ranks = JoinRankPerNode(cluster, kCount * sizeof(float), "compress");
  ASSERT_TRUE(ranks.ok);
  CollectiveOptions o;
  o.timeout = std::chrono::milliseconds(30000);
  std::vector<std::vector<float>> got;
  o.compression = "none";
  Totals before = Scrape(cluster);
  ASSERT_TRUE(AllReduceOnce(ranks, kCount, o, &got).ok());
  Totals after = Scrape(cluster);
  const double exact_wire = after.link_tx - before.link_tx;
  EXPECT_EQ(after.compressed_tx, 0) << "an exact AllReduce counted as compressed";
  ASSERT_GT(exact_wire, 2.0 * kCount * 4) << "3 nodes move 2 (N-1)/N of 1 MiB each";
  for (const auto& [codec, ratio] : std::vector<std::pair<std::string, double>>{
           {"fp16", 2.0}, {"bf16", 2.0}, {"int8", 4.0 * 128 / 132}, {"topk:0.01", 50.0}}) {
    SCOPED_TRACE(codec);
    o.compression = codec;
    before = Scrape(cluster);
    absl::Status s = AllReduceOnce(ranks, kCount, o, &got);
    ASSERT_TRUE(s.ok()) << s;
    after = Scrape(cluster);
    for (int r = 1; r < 3; ++r) {
      ASSERT_EQ(0, std::memcmp(got[0].data(), got[r].data(), kCount * 4)) << "rank " << r;
    }
    double worst = 0;
    for (size_t i = 0; i < kCount; ++i) {
      double exact = 0, mag = 0;
      for (int r = 0; r < 3; ++r) {
        exact += Value(r, i);
        mag += std::fabs(Value(r, i));
      }
      const double err = std::fabs(got[0][i] - exact);
      worst = std::max(worst, err / (mag + 1e-30));
      if (codec == "fp16") {
        ASSERT_LE(err, (mag + std::fabs(exact)) * std::ldexp(1.0, -11) * 1.01 + 1e-6) << i;
      } else if (codec == "bf16") {
        ASSERT_LE(err, (mag + std::fabs(exact)) * std::ldexp(1.0, -8) * 1.01 + 1e-6) << i;
      } else if (codec == "int8") {
        // docs/compression.md: scale/2 per contribution that crossed (the block's max / 127 of
        // each node's data) and of the result's block.
        const size_t lo = i / 128 * 128, hi = std::min(kCount, lo + 128);
        double bound = 0, res = 0;
        for (int r = 0; r < 3; ++r) {
          double m = 0;
          for (size_t j = lo; j < hi; ++j) m = std::max(m, std::fabs(double(Value(r, j))));
          bound += m / 254;
        }
        for (size_t j = lo; j < hi; ++j) res = std::max(res, std::fabs(double(got[0][j])));
        ASSERT_LE(err, (bound + res / 254) * (1 + 1e-5) + 1e-6) << i;
      }
    }
    // The link counters: what the messages stood for over what they took, and the fabric bytes
    // against the exact run's.
    const double unc = after.uncompressed_tx - before.uncompressed_tx;
    const double comp = after.compressed_tx - before.compressed_tx;
    const double wire = after.link_tx - before.link_tx;
    EXPECT_NEAR(unc, 3 * 2.0 * 2 / 3 * kCount * 4, unc * 0.01) << "2 (N-1)/N x M per node";
    EXPECT_NEAR(unc / comp, ratio, ratio * 0.03);
    EXPECT_GE(wire, comp);
    EXPECT_LE(wire, comp * 1.02 + 8192) << "only compressed payload (and digests) crossed";
    EXPECT_NEAR(exact_wire / wire, ratio, ratio * 0.08) << "exact " << exact_wire << " B";
    std::cout << codec << ": worst error / sum of |x| " << worst << ", link bytes " << wire
              << " against " << exact_wire << " exact (" << exact_wire / wire << "x)\n";
  }
}

// float16 and bfloat16 gradients (what mixed-precision training reduces): each node's partial is
// widened to float32 for the codec and the result rounded to the dtype once. The same bits on
// every rank, int8's bound plus that rounding, and the link counters measured against the data's
// own 2 bytes an element (int8 + scales: 2 x 128 / 132 = 1.94x).
TEST(CompressionTest, SixteenBitDataIsCompressedAgainstItsOwnBytes) {
  VirtualCluster cluster(3, {"--metrics_listen=127.0.0.1:0"}, PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  constexpr size_t kHalfCount = size_t{1} << 17;
  RankPerNode ranks = JoinRankPerNode(cluster, kHalfCount * 2, "compress16");
  ASSERT_TRUE(ranks.ok);
  for (const DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    const bool half = dtype == DataType::kFloat16;
    SCOPED_TRACE(half ? "float16" : "bfloat16");
    auto to_bits = [half](float f) {
      return half ? kernels::FloatToHalf(f) : kernels::FloatToBFloat16(f);
    };
    auto from_bits = [half](uint16_t b) {
      return half ? kernels::HalfToFloat(b) : kernels::BFloat16ToFloat(b);
    };
    auto value = [&](int r, size_t i) { return from_bits(to_bits(Value(r, i))); };
    CollectiveOptions o;
    o.timeout = std::chrono::milliseconds(30000);
    o.compression = "int8";
    const Totals before = Scrape(cluster);
    std::vector<Work> w(3);
    for (int r = 0; r < 3; ++r) {
      uint16_t* x = ranks.bufs[r].span<uint16_t>().data();
      for (size_t i = 0; i < kHalfCount; ++i) x[i] = to_bits(Value(r, i));
      w[r] =
          ranks.comms[r].AllReduce(ranks.bufs[r], ranks.bufs[r], kHalfCount, dtype, RedOp::kSum, o);
    }
    for (int r = 0; r < 3; ++r) {
      absl::Status st = w[r].wait(std::chrono::seconds(60));
      ASSERT_TRUE(st.ok()) << "rank " << r << ": " << st;
    }
    const Totals after = Scrape(cluster);
    const uint16_t* got = ranks.bufs[0].span<uint16_t>().data();
    for (int r = 1; r < 3; ++r) {
      ASSERT_EQ(0, std::memcmp(got, ranks.bufs[r].span<uint16_t>().data(), kHalfCount * 2))
          << "rank " << r;
    }
    for (size_t i = 0; i < kHalfCount; ++i) {
      double exact = 0;
      for (int r = 0; r < 3; ++r) exact += value(r, i);
      const double result = from_bits(got[i]);
      const size_t lo = i / 128 * 128, hi = std::min(kHalfCount, lo + 128);
      double bound = 0, res = 0;
      for (int r = 0; r < 3; ++r) {
        double m = 0;
        for (size_t j = lo; j < hi; ++j) m = std::max(m, std::fabs(double(value(r, j))));
        bound += m / 254;
      }
      for (size_t j = lo; j < hi; ++j) res = std::max(res, std::fabs(double(from_bits(got[j]))));
      const double rounding = std::fabs(result) * std::ldexp(1.0, half ? -11 : -8);
      ASSERT_LE(std::fabs(result - exact), (bound + res / 254) * 1.01 + rounding + 1e-6) << i;
    }
    const double unc = after.uncompressed_tx - before.uncompressed_tx;
    const double comp = after.compressed_tx - before.compressed_tx;
    EXPECT_NEAR(unc, 3 * 2.0 * 2 / 3 * kHalfCount * 2, unc * 0.01) << "2 (N-1)/N x M per node";
    EXPECT_NEAR(unc / comp, 2.0 * 128 / 132, 0.03);
  }
}

// The compressed ReduceScatter across three daemons: rank r's chunk within the codec's error on
// each of the other two nodes' contributions, and the links carrying the codec's ratio of what
// the exact reduce-scatter sends ((N - 1) / N of the input per node). Out of place: the output is
// the second half of each rank's buffer.
TEST(CompressionTest, ReduceScatterIsCompressedOnTheWayToEachOwnerOnly) {
  VirtualCluster cluster(3, {"--metrics_listen=127.0.0.1:0"}, PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  constexpr size_t kChunk = size_t{1} << 16;  // each rank's output
  constexpr size_t kTotal = 3 * kChunk;
  RankPerNode ranks = JoinRankPerNode(cluster, (kTotal + kChunk) * 4, "compress-rs");
  ASSERT_TRUE(ranks.ok);
  for (const auto& [codec, ratio] :
       std::vector<std::pair<std::string, double>>{{"int8", 4.0 * 128 / 132}, {"fp16", 2.0}}) {
    SCOPED_TRACE(codec);
    CollectiveOptions o;
    o.timeout = std::chrono::milliseconds(30000);
    o.compression = codec;
    const Totals before = Scrape(cluster);
    std::vector<Work> w(3);
    for (int r = 0; r < 3; ++r) {
      float* x = ranks.bufs[r].span<float>().data();
      for (size_t i = 0; i < kTotal; ++i) x[i] = Value(r, i);
      w[r] = ranks.comms[r].ReduceScatter(ranks.bufs[r], BufferRef(ranks.bufs[r], kTotal * 4),
                                          kChunk, DataType::kFloat32, RedOp::kSum, o);
    }
    for (int r = 0; r < 3; ++r) {
      absl::Status st = w[r].wait(std::chrono::seconds(60));
      ASSERT_TRUE(st.ok()) << "rank " << r << ": " << st;
    }
    const Totals after = Scrape(cluster);
    for (int r = 0; r < 3; ++r) {
      const float* out = ranks.bufs[r].span<float>().data() + kTotal;
      for (size_t j = 0; j < kChunk; ++j) {
        const size_t e = r * kChunk + j;
        double exact = 0, bound = 0;
        for (int q = 0; q < 3; ++q) {
          exact += Value(q, e);
          if (q == r) continue;  // one rank per node: rank q is node q's partial
          if (codec == "fp16") {
            bound += std::fabs(Value(q, e)) * std::ldexp(1.0, -11);
          } else {
            const size_t lo = r * kChunk + j / 128 * 128, hi = lo + 128;
            double m = 0;
            for (size_t k = lo; k < hi; ++k) m = std::max(m, std::fabs(double(Value(q, k))));
            bound += m / 254;
          }
        }
        ASSERT_LE(std::fabs(out[j] - exact), bound * 1.001 + 1e-5) << "rank " << r << " " << j;
      }
    }
    const double unc = after.uncompressed_tx - before.uncompressed_tx;
    const double comp = after.compressed_tx - before.compressed_tx;
    EXPECT_NEAR(unc, 3 * 2.0 / 3 * kTotal * 4, unc * 0.01) << "(N-1)/N of the input per node";
    EXPECT_NEAR(unc / comp, ratio, ratio * 0.03);
  }
}

// Error feedback (compression_key): over K AllReduces of the same data, the mean of what top-k
// 1% delivers converges to the exact sum; without the key the same small elements are dropped
// every time.
TEST(CompressionTest, ErrorFeedbackUnderAKeyRemovesTopKsBias) {
  VirtualCluster cluster(3, {}, PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  constexpr size_t kSmall = 4096;
  RankPerNode ranks = JoinRankPerNode(cluster, kSmall * sizeof(float), "feedback");
  ASSERT_TRUE(ranks.ok);
  auto mean_error = [&](std::optional<uint64_t> key, int steps) {
    CollectiveOptions o;
    o.compression = "topk:0.05";
    o.compression_key = key;
    std::vector<double> total(kSmall, 0);
    std::vector<std::vector<float>> got;
    for (int t = 0; t < steps; ++t) {
      absl::Status s = AllReduceOnce(ranks, kSmall, o, &got);
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) return 1e30;
      for (size_t i = 0; i < kSmall; ++i) total[i] += got[2][i];
    }
    double worst = 0;
    for (size_t i = 0; i < kSmall; ++i) {
      const double exact = Value(0, i) + Value(1, i) + Value(2, i);
      worst = std::max(worst, std::fabs(total[i] / steps - exact));
    }
    return worst;
  };
  const double without = mean_error(std::nullopt, 100);
  const double with = mean_error(uint64_t{7}, 100);
  EXPECT_GT(without, 0.5);
  EXPECT_LT(with, without / 5) << "without feedback " << without;
  std::cout << "mean error over 100 steps: " << with << " with feedback, " << without
            << " without\n";
}

TEST(CompressionTest, BadCompressionRequestsAreRefusedAndTheDaemonsGoOn) {
  VirtualCluster cluster(3, {"--max_residual_bytes_per_job=10000"}, PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  RankPerNode ranks = JoinRankPerNode(cluster, kCount * sizeof(float), "bad");
  ASSERT_TRUE(ranks.ok);
  std::vector<std::vector<float>> got;
  CollectiveOptions o;
  o.timeout = std::chrono::milliseconds(20000);
  // An unknown codec: refused at submission, naming it.
  o.compression = "int9";
  absl::Status s = AllReduceOnce(ranks, 1024, o, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("int9"));
  // A residual past the job's quota: every node refuses it alike (the same flag, the same size).
  o.compression = "int8";
  o.compression_key = 1;
  s = AllReduceOnce(ranks, 4096, o, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_residual_bytes_per_job"));
  // Within it, the same communicator goes on.
  s = AllReduceOnce(ranks, 1024, o, &got);
  EXPECT_TRUE(s.ok()) << s;
  // Nodes that disagree on the codec: found by the digest before anything runs, on every rank.
  std::vector<Work> w(3);
  for (int r = 0; r < 3; ++r) {
    CollectiveOptions each = o;
    each.compression_key.reset();
    each.compression = r == 1 ? "fp16" : "int8";
    w[r] = ranks.comms[r].AllReduce(ranks.bufs[r], ranks.bufs[r], 1024, DataType::kFloat32,
                                    RedOp::kSum, each);
  }
  for (int r = 0; r < 3; ++r) {
    absl::Status st = w[r].wait(std::chrono::seconds(30));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << "rank " << r << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("compression")) << st;
  }
  // The daemons serve a new communicator.
  RankPerNode again = JoinRankPerNode(cluster, 1024 * sizeof(float), "bad");
  ASSERT_TRUE(again.ok);
  o.compression_key.reset();
  s = AllReduceOnce(again, 1024, o, &got);
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace railyard::testing
