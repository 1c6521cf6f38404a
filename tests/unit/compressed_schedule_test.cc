// The compressed AllReduce schedule (daemon/scheduler/compressed.h), run by the symbolic executor
// with the real codecs: every rank ends with the same bits, within the documented error bound of
// the exact sum, the links carry the codec's bytes, and error feedback keeps the sum over many
// steps unbiased where dropping the residual does not.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "daemon/kernels/reduce.h"
#include "daemon/scheduler/compressed.h"
#include "daemon/scheduler/symbolic_executor.h"

namespace railyard::scheduler {
namespace {

using kernels::Codec;
using kernels::ParseCodec;

Codec C(const char* text) {
  auto c = ParseCodec(text);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

struct Result {
  std::vector<std::vector<float>> recv;  // by rank
  SimStats stats;
};

// Runs one compressed AllReduce of inputs[rank] on layout.
Result RunOnce(const CommLayout& layout, const std::vector<std::vector<float>>& inputs,
               const Codec& codec, size_t chunk, kernels::RedOp red, bool in_place,
               std::vector<std::vector<float>>* residuals) {
  const uint64_t count = inputs[0].size();
  OpShape shape;
  shape.op = OpKind::kAllReduce;
  shape.dtype = kernels::DataType::kFloat32;
  shape.red_op = red;
  shape.count = count;
  std::vector<NodeSchedule> nodes;
  for (int n = 0; n < layout.nnodes; ++n) {
    auto s = BuildCompressedAllReduce(layout, n, count, kernels::DataType::kFloat32, codec, chunk);
    EXPECT_TRUE(s.ok()) << s.status();
    nodes.push_back(*std::move(s));
  }
  SimMemory mem = SimMemory::ForOp(shape, layout.nranks, in_place, std::byte{0x5A});
  for (int r = 0; r < layout.nranks; ++r) {
    std::memcpy(mem.send(r), inputs[r].data(), count * sizeof(float));
  }
  SimOptions opt;
  opt.codec = codec;
  opt.residuals = residuals;
  auto stats = RunSymbolic(nodes, layout, shape, &mem, opt);
  EXPECT_TRUE(stats.ok()) << stats.status();
  Result out;
  if (stats.ok()) out.stats = *stats;
  for (int r = 0; r < layout.nranks; ++r) {
    std::vector<float> v(count);
    std::memcpy(v.data(), mem.recv(r), count * sizeof(float));
    out.recv.push_back(std::move(v));
  }
  return out;
}

std::vector<std::vector<float>> RandomInputs(int nranks, size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<std::vector<float>> in(nranks, std::vector<float>(count));
  for (auto& v : in) {
    for (float& x : v) x = dist(rng);
  }
  return in;
}

// The node partials (exact float32 sums of each node's ranks, in local order as the schedule
// adds them) and the exact total in double.
std::vector<std::vector<float>> NodePartials(const CommLayout& layout,
                                             const std::vector<std::vector<float>>& in) {
  std::vector<std::vector<float>> p(layout.nnodes, std::vector<float>(in[0].size(), 0.f));
  for (int n = 0; n < layout.nnodes; ++n) {
    const auto& ranks = layout.ranks_of_node[n];
    for (size_t i = 0; i < in[0].size(); ++i) {
      float acc = in[ranks[0]][i];
      for (size_t li = 1; li < ranks.size(); ++li) acc += in[ranks[li]][i];
      p[n][i] = acc;
    }
  }
  return p;
}

// Per element, the bound docs/compression.md states for int8:B: the sum over the contributions
// that crossed the wire of scale/2 (scale = max|block| / 127 of that node's partial) plus scale/2
// of the result's block, plus float32 rounding of the additions.
double Int8Bound(const std::vector<std::vector<float>>& partials, const std::vector<float>& result,
                 size_t i, uint32_t block) {
  const size_t lo = i / block * block;
  const size_t hi = std::min(result.size(), lo + block);
  double bound = 0;
  for (const auto& p : partials) {
    double m = 0;
    for (size_t j = lo; j < hi; ++j) m = std::max(m, std::fabs(double(p[j])));
    bound += m / 127 / 2;
  }
  double m = 0;
  for (size_t j = lo; j < hi; ++j) m = std::max(m, std::fabs(double(result[j])));
  bound += m / 127 / 2;
  return bound * (1 + 1e-5) + 1e-6;
}

struct Case {
  int nodes, ranks_per_node, rails;
};

TEST(CompressedAllReduceTest, EveryRankGetsTheSameBitsWithinTheCodecsBound) {
  for (const Case c : {Case{2, 1, 1}, Case{3, 2, 2}, Case{4, 3, 2}}) {
    const CommLayout layout = CommLayout::Uniform(c.nodes, c.ranks_per_node, c.rails);
    for (const char* name : {"fp16", "bf16", "int8", "int8:32", "topk:0.1"}) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{4099}}) {
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(testing::Message()
                       << c.nodes << "x" << c.ranks_per_node << " rails " << c.rails << " " << name
                       << " count " << count << (in_place ? " in place" : ""));
          const Codec codec = C(name);
          const auto in = RandomInputs(layout.nranks, count, 7 + count);
          const Result r = RunOnce(layout, in, codec, 512, kernels::RedOp::kSum, in_place, nullptr);
          ASSERT_EQ(r.recv.size(), static_cast<size_t>(layout.nranks));
          for (int k = 1; k < layout.nranks; ++k) {
            ASSERT_EQ(0, std::memcmp(r.recv[0].data(), r.recv[k].data(), count * 4))
                << "rank " << k << " differs from rank 0";
          }
          const auto partials = NodePartials(layout, in);
          for (size_t i = 0; i < count; ++i) {
            double exact = 0, mag = 0;
            for (const auto& v : in) {
              exact += v[i];
              mag += std::fabs(v[i]);
            }
            const double err = std::fabs(r.recv[0][i] - exact);
            if (codec.kind == kernels::CodecKind::kFp16) {
              // Each of the N partials and the result rounded once: 2^-11 relative each.
              ASSERT_LE(err, (mag + std::fabs(exact)) * std::ldexp(1.0, -11) * 1.01 + 1e-5) << i;
            } else if (codec.kind == kernels::CodecKind::kBf16) {
              ASSERT_LE(err, (mag + std::fabs(exact)) * std::ldexp(1.0, -8) * 1.01 + 1e-5) << i;
            } else if (codec.kind == kernels::CodecKind::kInt8) {
              ASSERT_LE(err, Int8Bound(partials, r.recv[0], i, codec.block)) << i;
            }
          }
          // What crossed the fabric: each unit once to its owner from every other node, and once
          // back to every other node, in the codec's bytes.
          uint64_t link_bytes = 0;
          for (const auto& [key, link] : r.stats.links) link_bytes += link.bytes;
          uint64_t expected = 0;
          for (int n = 0; n < layout.nnodes; ++n) {
            const NodeSchedule s = *BuildCompressedAllReduce(
                layout, n, count, kernels::DataType::kFloat32, codec, 512);
            for (const NodeStep& st : s.steps) {
              if (st.kind == NodeStep::Kind::kSend) {
                EXPECT_EQ(st.bytes, kernels::EncodedBytes(codec, st.aux / 4));
                expected += st.bytes;
              }
            }
          }
          EXPECT_EQ(link_bytes, expected);
        }
      }
    }
  }
}

TEST(CompressedAllReduceTest, LinksCarryTheCodecsRatioOfTheExactBytes) {
  const CommLayout layout = CommLayout::Uniform(3, 2, 2);
  const size_t count = 3 * 128 * 64;  // whole int8 blocks per shard
  const auto in = RandomInputs(layout.nranks, count, 3);
  // Uncompressed, the same direct exchange moves 2 (N - 1) / N of the data per node.
  const double exact_bytes = 2.0 * (layout.nnodes - 1) * count * 4;
  for (const auto& [name, ratio] : std::vector<std::pair<const char*, double>>{
           {"fp16", 2.0}, {"bf16", 2.0}, {"int8", 4.0 * 128 / (128 + 4)}, {"topk:0.01", 50.0}}) {
    SCOPED_TRACE(name);
    // Units of 2000 elements: top-k keeps exactly 1 % of each (the last, of 192, keeps 2).
    const Result r = RunOnce(layout, in, C(name), 8000, kernels::RedOp::kSum, false, nullptr);
    uint64_t bytes = 0;
    for (const auto& [key, link] : r.stats.links) bytes += link.bytes;
    EXPECT_NEAR(exact_bytes / bytes, ratio, ratio * 0.02);
  }
}

TEST(CompressedAllReduceTest, AvgDividesTheSameResultOnEveryRank) {
  const CommLayout layout = CommLayout::Uniform(3, 2, 1);
  const auto in = RandomInputs(layout.nranks, 999, 11);
  const Result sum = RunOnce(layout, in, C("int8"), 0, kernels::RedOp::kSum, false, nullptr);
  const Result avg = RunOnce(layout, in, C("int8"), 0, kernels::RedOp::kAvg, false, nullptr);
  for (size_t i = 0; i < 999; ++i) {
    ASSERT_FLOAT_EQ(avg.recv[3][i], sum.recv[3][i] / 6) << i;
    ASSERT_EQ(avg.recv[0][i], avg.recv[5][i]);
  }
}

// Over K steps of the same gradients, what error feedback sends sums to K times the exact result
// up to the last residuals (bounded, whatever K); without it top-k drops the same small elements
// every step and the error grows with K.
TEST(CompressedAllReduceTest, ErrorFeedbackKeepsTheSumOverStepsUnbiased) {
  const CommLayout layout = CommLayout::Uniform(3, 1, 1);
  const size_t count = 600;
  const auto in = RandomInputs(layout.nranks, count, 5);
  std::vector<double> exact(count, 0);
  for (const auto& v : in) {
    for (size_t i = 0; i < count; ++i) exact[i] += v[i];
  }
  const int kSteps = 1000;
  auto drift = [&](bool feedback) {
    std::vector<std::vector<float>> residuals;
    std::vector<double> total(count, 0);
    for (int t = 0; t < kSteps; ++t) {
      const Result r = RunOnce(layout, in, C("topk:0.05"), 0, kernels::RedOp::kSum, false,
                               feedback ? &residuals : nullptr);
      for (size_t i = 0; i < count; ++i) total[i] += r.recv[1][i];
    }
    double worst = 0;
    for (size_t i = 0; i < count; ++i) {
      worst = std::max(worst, std::fabs(total[i] / kSteps - exact[i]));
    }
    return worst;
  };
  const double with = drift(true);
  const double without = drift(false);
  // Without feedback an element never selected contributes nothing: the mean error is the element
  // itself. With it, every element is sent eventually; the mean error is (e_1 - e_K+1) / K.
  // Here each element is sent about every 20 steps, so a residual reaches ~20 gradients: the
  // mean error is ~20 |g| / K.
  EXPECT_GT(without, 0.5);
  EXPECT_LT(with, 0.1);
  EXPECT_LT(with, without / 10);
}

// float16 and bfloat16 data: each node's partial is widened to float32 and summed exactly, the
// codecs run on float32, and the result is rounded to the dtype once at the end (after avg's
// division). The bound is int8's plus that final rounding; the links carry the codec's bytes,
// counted against the data's own 2 bytes an element.
TEST(CompressedAllReduceTest, SixteenBitDataIsWidenedForTheCodecAndRoundedOnce) {
  const CommLayout layout = CommLayout::Uniform(3, 2, 2);
  for (const auto dtype : {kernels::DataType::kFloat16, kernels::DataType::kBFloat16}) {
    const bool half = dtype == kernels::DataType::kFloat16;
    auto to_bits = [half](float f) {
      return half ? kernels::FloatToHalf(f) : kernels::FloatToBFloat16(f);
    };
    auto from_bits = [half](uint16_t b) {
      return half ? kernels::HalfToFloat(b) : kernels::BFloat16ToFloat(b);
    };
    for (const auto red : {kernels::RedOp::kSum, kernels::RedOp::kAvg}) {
      for (size_t count : {size_t{1}, size_t{129}, size_t{3 * 128 * 20 + 5}}) {
        SCOPED_TRACE(testing::Message()
                     << kernels::Name(dtype) << " " << kernels::Name(red) << " count " << count);
        const Codec codec = C("int8");
        // Inputs exactly representable in the dtype.
        auto in = RandomInputs(layout.nranks, count, 17 + count);
        std::vector<std::vector<uint16_t>> bits(layout.nranks, std::vector<uint16_t>(count));
        for (int r = 0; r < layout.nranks; ++r) {
          for (size_t i = 0; i < count; ++i) {
            bits[r][i] = to_bits(in[r][i]);
            in[r][i] = from_bits(bits[r][i]);
          }
        }
        OpShape shape;
        shape.op = OpKind::kAllReduce;
        shape.dtype = dtype;
        shape.red_op = red;
        shape.count = count;
        std::vector<NodeSchedule> nodes;
        uint64_t wire = 0, stands_for = 0;
        for (int n = 0; n < layout.nnodes; ++n) {
          auto s = BuildCompressedAllReduce(layout, n, count, dtype, codec, 4096);
          ASSERT_TRUE(s.ok()) << s.status();
          for (const NodeStep& st : s->steps) {
            if (st.kind != NodeStep::Kind::kSend) continue;
            EXPECT_EQ(st.bytes, kernels::EncodedBytes(codec, st.aux / 2));
            wire += st.bytes;
            stands_for += st.aux;
          }
          nodes.push_back(*std::move(s));
        }
        SimMemory mem = SimMemory::ForOp(shape, layout.nranks, false, std::byte{0x5A});
        for (int r = 0; r < layout.nranks; ++r) {
          std::memcpy(mem.send(r), bits[r].data(), count * 2);
        }
        SimOptions opt;
        opt.codec = codec;
        auto stats = RunSymbolic(nodes, layout, shape, &mem, opt);
        ASSERT_TRUE(stats.ok()) << stats.status();
        uint64_t link_bytes = 0;
        for (const auto& [key, link] : stats->links) link_bytes += link.bytes;
        EXPECT_EQ(link_bytes, wire);
        // What the exact path would carry: each element of a non-owner twice, 2 bytes each.
        EXPECT_EQ(stands_for, 2 * (layout.nnodes - 1) * count * 2);
        std::vector<std::vector<uint16_t>> out(layout.nranks, std::vector<uint16_t>(count));
        for (int r = 0; r < layout.nranks; ++r) std::memcpy(out[r].data(), mem.recv(r), count * 2);
        for (int r = 1; r < layout.nranks; ++r) ASSERT_EQ(out[0], out[r]) << "rank " << r;
        // The float32 result before rounding is within int8's bound of the exact sum; rounding
        // to the dtype adds half an ulp of the result (2^-11 or 2^-8 relative).
        const auto partials = NodePartials(layout, in);
        std::vector<float> result(count);
        const double div = red == kernels::RedOp::kAvg ? layout.nranks : 1;
        for (size_t i = 0; i < count; ++i) result[i] = from_bits(out[0][i]);
        std::vector<float> unrounded(count);
        for (size_t i = 0; i < count; ++i) unrounded[i] = static_cast<float>(result[i] * div);
        for (size_t i = 0; i < count; ++i) {
          double exact = 0;
          for (const auto& v : in) exact += v[i];
          const double rounding = std::fabs(result[i]) * std::ldexp(1.0, half ? -11 : -8) * 1.01;
          const double err = std::fabs(result[i] - exact / div);
          ASSERT_LE(err,
                    Int8Bound(partials, unrounded, i, codec.block) * 1.01 / div + rounding + 1e-6)
              << i;
        }
      }
    }
  }
}

// The compressed ReduceScatter: rank r's output is the exact sum of every rank's r-th chunk up to
// the codec's error on each of the other nodes' partials (never on the owner's, and the result is
// not compressed again); it crosses the fabric once per other node, to the owner only.
TEST(CompressedReduceScatterTest, EachOutputIsWithinTheOtherNodesCodecErrors) {
  for (const Case c : {Case{2, 1, 1}, Case{3, 2, 2}, Case{4, 3, 2}}) {
    const CommLayout layout = CommLayout::Uniform(c.nodes, c.ranks_per_node, c.rails);
    for (const char* name : {"fp16", "int8", "int8:32", "topk:0.1"}) {
      for (size_t count : {size_t{1}, size_t{300}, size_t{1031}}) {
        for (const auto red : {kernels::RedOp::kSum, kernels::RedOp::kAvg}) {
          for (bool in_place : {false, true}) {
            SCOPED_TRACE(testing::Message() << c.nodes << "x" << c.ranks_per_node << " rails "
                                            << c.rails << " " << name << " count " << count << " "
                                            << kernels::Name(red) << (in_place ? " in place" : ""));
            const Codec codec = C(name);
            const size_t total = count * layout.nranks;
            const auto in = RandomInputs(layout.nranks, total, 3 + count);
            OpShape shape;
            shape.op = OpKind::kReduceScatter;
            shape.dtype = kernels::DataType::kFloat32;
            shape.red_op = red;
            shape.count = count;
            std::vector<NodeSchedule> nodes;
            uint64_t wire = 0;
            for (int n = 0; n < layout.nnodes; ++n) {
              auto sch = BuildCompressedReduceScatter(layout, n, count, shape.dtype, codec, 512);
              ASSERT_TRUE(sch.ok()) << sch.status();
              // One float32 partial per node: only the node's first rank has scratch.
              EXPECT_TRUE(sch->scratch_first_rank_only);
              for (const NodeStep& st : sch->steps) {
                for (const RankRef& ref : {st.src, st.dst}) {
                  if (ref.space == RankRef::Space::kScratch) {
                    ASSERT_EQ(ref.rank, layout.ranks_of_node[n][0]);
                  }
                }
                if (st.kind == NodeStep::Kind::kSend) {
                  EXPECT_EQ(st.bytes, kernels::EncodedBytes(codec, st.aux / 4));
                  wire += st.bytes;
                }
              }
              nodes.push_back(*std::move(sch));
            }
            SimMemory mem = SimMemory::ForOp(shape, layout.nranks, in_place, std::byte{0x5A});
            for (int r = 0; r < layout.nranks; ++r) {
              std::memcpy(mem.send(r), in[r].data(), total * 4);
            }
            SimOptions opt;
            opt.codec = codec;
            auto stats = RunSymbolic(nodes, layout, shape, &mem, opt);
            ASSERT_TRUE(stats.ok()) << stats.status();
            uint64_t link_bytes = 0;
            for (const auto& [key, link] : stats->links) link_bytes += link.bytes;
            EXPECT_EQ(link_bytes, wire);
            // Every element crossed once from each non-owner node: (N - 1) / N of the input.
            const auto partials = NodePartials(layout, in);
            const double div = red == kernels::RedOp::kAvg ? layout.nranks : 1;
            uint64_t exact_bytes = 0;
            for (int r = 0; r < layout.nranks; ++r) {
              std::vector<float> out(count);
              std::memcpy(out.data(), mem.recv(r), count * 4);
              const int owner = layout.node_of_rank[r];
              for (size_t j = 0; j < count; ++j) {
                const size_t e = r * count + j;
                double exact = 0, mag = 0, bound = 0;
                for (const auto& v : in) {
                  exact += v[e];
                  mag += std::fabs(v[e]);
                }
                for (int n = 0; n < layout.nnodes; ++n) {
                  if (n == owner) continue;
                  if (codec.kind == kernels::CodecKind::kFp16) {
                    bound += std::fabs(partials[n][e]) * std::ldexp(1.0, -11);
                  } else if (codec.kind == kernels::CodecKind::kInt8) {
                    // Blocks start at the output's first element (units are whole blocks).
                    const size_t lo = r * count + j / codec.block * codec.block;
                    const size_t hi = std::min((r + 1) * count, lo + codec.block);
                    double m = 0;
                    for (size_t k = lo; k < hi; ++k)
                      m = std::max(m, std::fabs(double(partials[n][k])));
                    bound += m / 127 / 2;
                  } else {
                    bound += std::fabs(partials[n][e]);  // top-k may drop the whole partial
                  }
                }
                const double err = std::fabs(out[j] - exact / div);
                ASSERT_LE(err, (bound * (1 + 1e-5) + mag * 1e-6 + 1e-6) / div)
                    << "rank " << r << " elem " << j;
              }
              exact_bytes += count * 4 * (layout.nnodes - 1);
            }
            if (codec.kind == kernels::CodecKind::kFp16) {
              EXPECT_NEAR(double(exact_bytes) / link_bytes, 2.0, 0.01);
            }
          }
        }
      }
    }
  }
}

TEST(CompressedAllReduceTest, RefusesWhatItCannotRun) {
  const auto f32 = kernels::DataType::kFloat32;
  EXPECT_FALSE(
      BuildCompressedAllReduce(CommLayout::Uniform(1, 2, 1), 0, 10, f32, C("int8"), 0).ok());
  EXPECT_FALSE(BuildCompressedAllReduce(CommLayout::Uniform(2, 1, 1), 0, 10, f32, Codec{}, 0).ok());
  auto f64 = BuildCompressedAllReduce(CommLayout::Uniform(2, 1, 1), 0, 10,
                                      kernels::DataType::kFloat64, C("int8"), 0);
  EXPECT_THAT(f64.status().message(),
              testing::HasSubstr("takes float32, float16 or bfloat16 data, not double"));
  EXPECT_TRUE(
      CompressionApplies(OpKind::kAllReduce, kernels::DataType::kFloat16, kernels::RedOp::kSum, 2));
  EXPECT_TRUE(CompressionApplies(OpKind::kAllReduce, kernels::DataType::kBFloat16,
                                 kernels::RedOp::kAvg, 2));
  EXPECT_FALSE(
      CompressionApplies(OpKind::kAllReduce, kernels::DataType::kFloat64, kernels::RedOp::kSum, 2));
  EXPECT_TRUE(
      CompressionApplies(OpKind::kAllReduce, kernels::DataType::kFloat32, kernels::RedOp::kAvg, 2));
  EXPECT_FALSE(
      CompressionApplies(OpKind::kAllReduce, kernels::DataType::kFloat32, kernels::RedOp::kMax, 2));
  EXPECT_FALSE(
      CompressionApplies(OpKind::kAllReduce, kernels::DataType::kInt32, kernels::RedOp::kSum, 2));
  EXPECT_FALSE(
      CompressionApplies(OpKind::kAllGather, kernels::DataType::kFloat32, kernels::RedOp::kSum, 2));
  EXPECT_TRUE(CompressionApplies(OpKind::kReduceScatter, kernels::DataType::kFloat32,
                                 kernels::RedOp::kSum, 2));
  EXPECT_FALSE(CompressionApplies(OpKind::kReduceScatter, kernels::DataType::kFloat32,
                                  kernels::RedOp::kMax, 2));
  EXPECT_FALSE(
      BuildCompressedReduceScatter(CommLayout::Uniform(1, 2, 1), 0, 10, f32, C("int8"), 0).ok());
  EXPECT_FALSE(
      CompressionApplies(OpKind::kAllReduce, kernels::DataType::kFloat32, kernels::RedOp::kSum, 1));
}

}  // namespace
}  // namespace railyard::scheduler
