// railyard-perf's daemon-free logic: flags, sizes, nccl-tests' sizing and bandwidth factors, the
// data-check patterns and references, and the table layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/kernels/types.h"
#include "tools/perf/data_check.h"
#include "tools/perf/perf_args.h"
#include "tools/perf/perf_op.h"
#include "tools/perf/result_table.h"

namespace railyard::perf {
namespace {

using kernels::DataType;
using kernels::RedOp;

absl::StatusOr<PerfArgs> Parse(std::vector<std::string> args) {
  return ParsePerfArgs(args, "/tmp/env.sock");
}

TEST(ParseSizeTest, SuffixesArePowersOf1024) {
  EXPECT_EQ(*ParseSize("8"), 8u);
  EXPECT_EQ(*ParseSize("64K"), 64u * 1024);
  EXPECT_EQ(*ParseSize("64k"), 64u * 1024);
  EXPECT_EQ(*ParseSize("1M"), 1u << 20);
  EXPECT_EQ(*ParseSize("2G"), size_t{2} << 30);
  EXPECT_EQ(*ParseSize("0.5M"), 512u * 1024);
  EXPECT_EQ(*ParseSize("0"), 0u);
}

TEST(ParseSizeTest, RejectsGarbage) {
  for (const char* bad : {"", "K", "abc", "8X", "-8", "+8", "8 K", "1e3", "8KB", "1.5.2M"}) {
    EXPECT_FALSE(ParseSize(bad).ok()) << bad;
  }
  EXPECT_FALSE(ParseSize("99999999G").ok());  // absurdly large
}

TEST(ParsePerfArgsTest, DefaultsFollowNcclTests) {
  absl::StatusOr<PerfArgs> args = Parse({});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->min_bytes, 32u << 20);
  EXPECT_EQ(args->max_bytes, 32u << 20);
  EXPECT_EQ(args->iters, 20);
  EXPECT_EQ(args->warmup_iters, 5);
  EXPECT_EQ(args->check, 1);
  EXPECT_EQ(args->root, 0);
  EXPECT_EQ(args->op, PerfOp::kAllReduce);
  EXPECT_EQ(args->dtypes, std::vector<DataType>{DataType::kFloat32});
  EXPECT_EQ(args->redops, std::vector<RedOp>{RedOp::kSum});
  EXPECT_EQ(args->daemons, std::vector<std::string>{"/tmp/env.sock"});
  EXPECT_EQ(args->ranks_per_daemon, 1);
  EXPECT_FALSE(args->worker);
}

TEST(ParsePerfArgsTest, DefaultSocketWithoutEnvironment) {
  absl::StatusOr<PerfArgs> args = ParsePerfArgs({}, nullptr);
  ASSERT_TRUE(args.ok());
  EXPECT_EQ(args->daemons, std::vector<std::string>{"/run/railyard/railyard.sock"});
}

TEST(ParsePerfArgsTest, AllFlagSpellings) {
  absl::StatusOr<PerfArgs> args = Parse({"-b",
                                         "8",
                                         "-e64M",
                                         "--stepfactor=4",
                                         "-n",
                                         "7",
                                         "--warmup_iters",
                                         "2",
                                         "-c",
                                         "0",
                                         "-o",
                                         "max",
                                         "-d",
                                         "bfloat16",
                                         "-r",
                                         "3",
                                         "--op",
                                         "reducescatter",
                                         "--daemons",
                                         "/a.sock,/b.sock",
                                         "--ranks-per-daemon",
                                         "2",
                                         "--timeout_ms",
                                         "1500",
                                         "--job",
                                         "j1",
                                         "--token",
                                         "t"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->min_bytes, 8u);
  EXPECT_EQ(args->max_bytes, 64u << 20);
  EXPECT_EQ(args->step_factor, 4u);
  EXPECT_EQ(args->iters, 7);
  EXPECT_EQ(args->warmup_iters, 2);
  EXPECT_EQ(args->check, 0);
  EXPECT_EQ(args->redops, std::vector<RedOp>{RedOp::kMax});
  EXPECT_EQ(args->dtypes, std::vector<DataType>{DataType::kBFloat16});
  EXPECT_EQ(args->root, 3);
  EXPECT_EQ(args->op, PerfOp::kReduceScatter);
  EXPECT_EQ(args->daemons, (std::vector<std::string>{"/a.sock", "/b.sock"}));
  EXPECT_EQ(args->ranks_per_daemon, 2);
  EXPECT_EQ(args->nranks(), 4);
  EXPECT_EQ(args->timeout_ms, 1500u);
  EXPECT_EQ(args->job, "j1");
  EXPECT_EQ(args->token, "t");
}

TEST(ParsePerfArgsTest, AllTypesAndOpsInNcclTestsOrder) {
  absl::StatusOr<PerfArgs> args = Parse({"-d", "all", "-o", "all"});
  ASSERT_TRUE(args.ok());
  EXPECT_EQ(args->dtypes.size(), 10u);
  EXPECT_EQ(args->dtypes.front(), DataType::kInt8);
  EXPECT_EQ(args->dtypes.back(), DataType::kBFloat16);
  EXPECT_EQ(args->redops,
            (std::vector<RedOp>{RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg}));
}

TEST(ParsePerfArgsTest, BadFlagsAreErrorsNamingTheFlag) {
  struct BadCase {
    std::vector<std::string> args;
    const char* mentions;
  };
  const BadCase cases[] = {
      {{"-x", "1"}, "-x"},
      {{"--bogus"}, "--bogus"},
      {{"positional"}, "positional"},
      {{"-b"}, "needs a value"},
      {{"-b", "lots"}, "-b"},
      {{"-e", "8Q"}, "-e"},
      {{"-n", "0"}, "-n"},
      {{"-n", "ten"}, "-n"},
      {{"-w", "-1"}, "-w"},
      {{"-f", "0"}, "-f"},
      {{"-d", "float128"}, "float128"},
      {{"-o", "xor"}, "xor"},
      {{"--op", "allscatter"}, "allscatter"},
      {{"--ranks-per-daemon", "0"}, "--ranks-per-daemon"},
      {{"--daemons", "/a.sock,,/b.sock"}, "empty socket"},
      {{"-b", "1M", "-e", "1K"}, "larger"},
      {{"-r", "1"}, "-r 1"},  // one rank only
      {{"-b", "8", "-e", "1G", "-i", "1"}, "sizes"},
      {{"-b", "0", "-e", "8", "-f", "2"}, "never grows"},
      {{"--help=yes"}, "takes no value"},
      {{"--interval_us", "-5"}, "--interval_us"},
      {{"--interval_us", "61000000"}, "--interval_us"},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<PerfArgs> args = Parse(c.args);
    ASSERT_FALSE(args.ok()) << c.args[0];
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(args.status().message().find(c.mentions), std::string::npos)
        << args.status().message();
  }
}

TEST(ParsePerfArgsTest, LatencyFileAndItsDutyCycle) {
  absl::StatusOr<PerfArgs> args = Parse({"--latency_file", "/tmp/lat", "--interval_us=5000"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->latency_file, "/tmp/lat");
  EXPECT_EQ(args->interval_us, 5000);
  EXPECT_EQ(Parse({})->interval_us, 0);  // back to back unless asked
}

TEST(ParsePerfArgsTest, DeviceBuffersNeedTheHostDataCheckOff) {
  EXPECT_EQ(Parse({})->device, -1);  // host memory unless asked
  absl::StatusOr<PerfArgs> args = Parse({"--device", "1", "-c", "0"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->device, 1);
  absl::StatusOr<PerfArgs> checked = Parse({"--device=0"});
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(checked.status().message().find("--device needs -c 0"), std::string::npos);
  EXPECT_FALSE(Parse({"--device=-1", "-c", "0"}).ok());
  // Fake device memory is mapped by the rank too: the data check works on it.
  absl::StatusOr<PerfArgs> fake = Parse({"--device=0", "--fake_device"});
  ASSERT_TRUE(fake.ok()) << fake.status();
  EXPECT_TRUE(fake->fake_device);
  EXPECT_EQ(fake->check, 1);
  absl::StatusOr<PerfArgs> no_device = Parse({"--fake_device"});
  ASSERT_FALSE(no_device.ok());
  EXPECT_NE(no_device.status().message().find("--fake_device needs --device N"), std::string::npos);
}

TEST(ParsePerfArgsTest, StreamSyncIsOffUnlessAsked) {
  EXPECT_FALSE(Parse({})->stream_sync);
  absl::StatusOr<PerfArgs> args = Parse({"--stream_sync", "-b", "8", "-e", "8"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->stream_sync);
  EXPECT_FALSE(Parse({"--stream_sync=yes"}).ok());  // a switch takes no value
}

TEST(ParsePerfArgsTest, WorkerFlagsRoundTrip) {
  std::vector<std::string> argv = {"--op", "sendrecv", "--ranks-per-daemon", "4"};
  for (std::string& flag : WorkerFlags(3, "/x.sock", "ry1-abc@local:n", 42, "/tmp/r")) {
    argv.push_back(flag);
  }
  absl::StatusOr<PerfArgs> args = Parse(argv);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->worker);
  EXPECT_EQ(args->rank, 3);
  EXPECT_EQ(args->socket, "/x.sock");
  EXPECT_EQ(args->comm_id, "ry1-abc@local:n");
  EXPECT_EQ(args->parent_pid, 42);
  EXPECT_EQ(args->rank_dir, "/tmp/r");
  EXPECT_FALSE(Parse({"--_rank", "4", "--_socket", "/s", "--_comm_id", "c"}).ok());
}

TEST(SizeSweepTest, FactorAndStep) {
  PerfArgs args = *Parse({"-b", "8", "-e", "64M", "-f", "4"});
  std::vector<size_t> sizes = SizeSweep(args);
  ASSERT_EQ(sizes.size(), 12u);  // 8 * 4^k <= 64M: 8 B .. 32 MiB
  EXPECT_EQ(sizes.front(), 8u);
  EXPECT_EQ(sizes.back(), size_t{32} << 20);
  EXPECT_EQ(SizeSweep(*Parse({"-b", "1K", "-e", "4K", "-i", "1K"})),
            (std::vector<size_t>{1024, 2048, 3072, 4096}));
  EXPECT_EQ(SizeSweep(*Parse({"-b", "8", "-e", "8"})), std::vector<size_t>{8});
  EXPECT_EQ(SizeSweep(*Parse({"--op", "barrier", "-b", "8", "-e", "1M", "-f", "2"})),
            std::vector<size_t>{0});
}

TEST(PerfOpTest, NamesRoundTrip) {
  for (PerfOp op : {PerfOp::kAllReduce, PerfOp::kReduceScatter, PerfOp::kAllGather,
                    PerfOp::kBroadcast, PerfOp::kReduce, PerfOp::kAllToAll, PerfOp::kAllToAllv,
                    PerfOp::kSendRecv, PerfOp::kBarrier}) {
    PerfOp parsed;
    ASSERT_TRUE(ParsePerfOp(Name(op), &parsed)) << Name(op);
    EXPECT_EQ(parsed, op);
  }
  PerfOp parsed;
  EXPECT_TRUE(ParsePerfOp("All_Reduce", &parsed));
  EXPECT_EQ(parsed, PerfOp::kAllReduce);
  EXPECT_FALSE(ParsePerfOp("allreduc", &parsed));
}

TEST(PerfOpTest, BusBwFactorsMatchNcclTests) {
  EXPECT_DOUBLE_EQ(BusBwFactor(PerfOp::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(BusBwFactor(PerfOp::kAllReduce, 1), 0.0);
  EXPECT_DOUBLE_EQ(BusBwFactor(PerfOp::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(BusBwFactor(PerfOp::kReduceScatter, 8), 0.875);
  EXPECT_DOUBLE_EQ(BusBwFactor(PerfOp::kAllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(BusBwFactor(PerfOp::kAllToAllv, 2), 0.5);
  EXPECT_DOUBLE_EQ(BusBwFactor(PerfOp::kBroadcast, 4), 1.0);
  EXPECT_DOUBLE_EQ(BusBwFactor(PerfOp::kReduce, 4), 1.0);
  EXPECT_DOUBLE_EQ(BusBwFactor(PerfOp::kSendRecv, 4), 1.0);
}

TEST(PerfOpTest, LayoutFollowsNcclTestsSizeSemantics) {
  // AllReduce: size is the per-rank message.
  OpLayout ar = LayoutFor(PerfOp::kAllReduce, 1024, 4, 4);
  EXPECT_EQ(ar.count, 256u);
  EXPECT_EQ(PrintedBytes(ar, 4), 1024u);
  EXPECT_DOUBLE_EQ(AlgBwBytes(PerfOp::kAllReduce, ar, 4, 4), 1024.0);
  // AllGather: size is the gathered total; count per rank.
  OpLayout ag = LayoutFor(PerfOp::kAllGather, 1024, 4, 4);
  EXPECT_EQ(ag.count, 64u);
  EXPECT_EQ(ag.send_count, 64u);
  EXPECT_EQ(ag.recv_count, 256u);
  EXPECT_EQ(PrintedBytes(ag, 4), 1024u);
  EXPECT_DOUBLE_EQ(AlgBwBytes(PerfOp::kAllGather, ag, 4, 4), 1024.0);
  EXPECT_EQ(SendSlot(PerfOp::kAllGather, ag, 2, true).offset, 128u);
  EXPECT_EQ(RecvSlot(PerfOp::kAllGather, ag, 2, true).offset, 0u);
  // ReduceScatter: size is the scattered input; in-place result at rank * count.
  OpLayout rs = LayoutFor(PerfOp::kReduceScatter, 1000, 4, 3);
  EXPECT_EQ(rs.count, 83u);
  EXPECT_EQ(rs.send_count, 249u);
  EXPECT_EQ(PrintedBytes(rs, 4), 996u);
  EXPECT_EQ(RecvSlot(PerfOp::kReduceScatter, rs, 2, true).offset, 166u);
  EXPECT_EQ(RecvSlot(PerfOp::kReduceScatter, rs, 2, false).offset, 0u);
  // AllToAll: per-peer count.
  OpLayout a2a = LayoutFor(PerfOp::kAllToAll, 4096, 8, 4);
  EXPECT_EQ(a2a.count, 128u);
  EXPECT_EQ(a2a.send_count, 512u);
  EXPECT_EQ(a2a.recv_buffer_count, 512u);
  // SendRecv in-place: send and receive in disjoint halves of the recv buffer.
  OpLayout sr = LayoutFor(PerfOp::kSendRecv, 64, 4, 2);
  EXPECT_EQ(sr.recv_buffer_count, 32u);
  EXPECT_EQ(SendSlot(PerfOp::kSendRecv, sr, 1, true).offset, 0u);
  EXPECT_EQ(RecvSlot(PerfOp::kSendRecv, sr, 1, true).offset, 16u);
  EXPECT_EQ(SendPeer(3, 4), 0);
  EXPECT_EQ(RecvPeer(0, 4), 3);
}

TEST(PerfOpTest, AllToAllvCountsAreSymmetricAndBounded) {
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 5; ++j) {
      EXPECT_EQ(AllToAllvCount(100, i, j), AllToAllvCount(100, j, i));
      EXPECT_LE(AllToAllvCount(100, i, j), 100u);
    }
  }
}

TEST(DataCheckTest, FloatConversionsRoundToNearestEven) {
  EXPECT_EQ(ReferenceFloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(ReferenceFloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(ReferenceFloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(ReferenceFloatToHalf(65520.0f), 0x7C00);             // tie rounds to even = infinity
  EXPECT_EQ(ReferenceFloatToHalf(1.0f + 0x1p-11f), 0x3C00);      // tie to even (down)
  EXPECT_EQ(ReferenceFloatToHalf(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie to even (up)
  EXPECT_EQ(ReferenceFloatToHalf(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_FLOAT_EQ(ReferenceHalfToFloat(0x3555), 0.33325195f);
  EXPECT_FLOAT_EQ(ReferenceHalfToFloat(0x0001), 0x1p-24f);
  EXPECT_TRUE(std::isnan(ReferenceHalfToFloat(ReferenceFloatToHalf(NAN))));
  EXPECT_EQ(ReferenceFloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(ReferenceFloatToBFloat16(1.0f + 0x1p-8f), 0x3F80);      // tie to even (down)
  EXPECT_EQ(ReferenceFloatToBFloat16(1.0f + 3 * 0x1p-8f), 0x3F82);  // tie to even (up)
  EXPECT_FLOAT_EQ(ReferenceBFloat16ToFloat(0xC040), -3.0f);
  for (int v = -256; v <= 256; ++v) {  // the pattern's small integers are exact
    EXPECT_EQ(ReferenceHalfToFloat(ReferenceFloatToHalf(v)), v);
    EXPECT_EQ(ReferenceBFloat16ToFloat(ReferenceFloatToBFloat16(v)), v);
  }
}

TEST(DataCheckTest, PatternsAreSmallAndExact) {
  for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax, RedOp::kAvg}) {
    for (DataType dtype : {DataType::kInt8, DataType::kUint8, DataType::kFloat16}) {
      PatternParams p{dtype, op, 5, 3};
      for (size_t i = 0; i < 100; ++i) {
        int twos = 0;
        for (int r = 0; r < 5; ++r) {
          int64_t v = PatternValue(p, r, i);
          EXPECT_LE(std::abs(v), 10);
          if (dtype == DataType::kUint8) {
            EXPECT_GE(v, 0);
          }
          if (op == RedOp::kProd) twos += std::abs(v) == 2;
        }
        if (op == RedOp::kProd) {
          EXPECT_EQ(twos, 1);  // |product| == 2: exact everywhere
        }
      }
    }
  }
  // A new seed changes the data.
  PatternParams a{DataType::kFloat32, RedOp::kSum, 4, 1};
  PatternParams b{DataType::kFloat32, RedOp::kSum, 4, 2};
  EXPECT_NE(PatternValue(a, 0, 0), PatternValue(b, 0, 0));
}

// The reference of every dtype x redop equals an independent computation in double.
TEST(DataCheckTest, ReferenceMatchesDirectComputation) {
  const int nranks = 3;
  const size_t count = 50;
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                         DataType::kBFloat16, DataType::kInt32, DataType::kInt64}) {
    for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax}) {
      PatternParams p{dtype, op, nranks, 7};
      std::vector<unsigned char> got(count * kernels::ElementSize(dtype));
      std::vector<unsigned char> want(got.size());
      FillReduced(p, 10, count, got.data());
      std::vector<double> values(count);
      for (size_t i = 0; i < count; ++i) {
        double acc = PatternValue(p, 0, 10 + i);
        for (int r = 1; r < nranks; ++r) {
          double v = PatternValue(p, r, 10 + i);
          acc = op == RedOp::kSum    ? acc + v
                : op == RedOp::kProd ? acc * v
                : op == RedOp::kMin  ? std::min(acc, v)
                                     : std::max(acc, v);
        }
        values[i] = acc;
      }
      // Store the doubles through FillInput's path: a one-rank "pattern" is not available, so
      // compare element values instead.
      for (size_t i = 0; i < count; ++i) {
        double g = 0;
        const unsigned char* e = got.data() + i * kernels::ElementSize(dtype);
        switch (dtype) {
          case DataType::kFloat32: {
            float f;
            std::memcpy(&f, e, 4);
            g = f;
            break;
          }
          case DataType::kFloat64:
            std::memcpy(&g, e, 8);
            break;
          case DataType::kFloat16: {
            uint16_t h;
            std::memcpy(&h, e, 2);
            g = ReferenceHalfToFloat(h);
            break;
          }
          case DataType::kBFloat16: {
            uint16_t h;
            std::memcpy(&h, e, 2);
            g = ReferenceBFloat16ToFloat(h);
            break;
          }
          case DataType::kInt32: {
            int32_t x;
            std::memcpy(&x, e, 4);
            g = x;
            break;
          }
          default: {
            int64_t x;
            std::memcpy(&x, e, 8);
            g = static_cast<double>(x);
            break;
          }
        }
        EXPECT_EQ(g, values[i]) << kernels::Name(dtype) << " " << kernels::Name(op) << " " << i;
      }
    }
  }
}

TEST(DataCheckTest, AvgFollowsTheKernels) {
  // float: float32 sum / nranks; integers: truncation toward zero.
  PatternParams pf{DataType::kFloat32, RedOp::kAvg, 3, 0};
  PatternParams pi{DataType::kInt32, RedOp::kAvg, 3, 0};
  float f[20];
  int32_t n[20];
  FillReduced(pf, 0, 20, f);
  FillReduced(pi, 0, 20, n);
  for (size_t i = 0; i < 20; ++i) {
    int64_t sum = 0;
    for (int r = 0; r < 3; ++r) sum += PatternValue(pi, r, i);
    EXPECT_FLOAT_EQ(f[i], static_cast<float>(sum) / 3.0f);
    EXPECT_EQ(n[i], static_cast<int32_t>(sum / 3));
  }
  // 8-bit integers wrap; uint8 sum of 0..10 over 40 ranks exceeds 255.
  PatternParams pu{DataType::kUint8, RedOp::kSum, 40, 1};
  uint8_t u[8];
  FillReduced(pu, 0, 8, u);
  for (size_t i = 0; i < 8; ++i) {
    uint64_t sum = 0;
    for (int r = 0; r < 40; ++r) sum += static_cast<uint64_t>(PatternValue(pu, r, i));
    EXPECT_EQ(u[i], static_cast<uint8_t>(sum));
  }
}

TEST(DataCheckTest, CountWrongCountsMismatchesAndSentinels) {
  PatternParams p{DataType::kFloat16, RedOp::kSum, 4, 9};
  std::vector<uint16_t> want(64), got(64);
  FillReduced(p, 0, 64, want.data());
  got = want;
  EXPECT_EQ(CountWrong(DataType::kFloat16, got.data(), want.data(), 64), 0u);
  got[3] = ReferenceFloatToHalf(ReferenceHalfToFloat(got[3]) + 1.0f);
  EXPECT_EQ(CountWrong(DataType::kFloat16, got.data(), want.data(), 64), 1u);
  FillSentinel(DataType::kFloat16, 64, got.data());
  EXPECT_EQ(CountWrong(DataType::kFloat16, got.data(), want.data(), 64), 64u);
  // Within tolerance: one float32 ulp off is not wrong.
  float a = 3.0f, b = std::nextafter(3.0f, 4.0f);
  EXPECT_EQ(CountWrong(DataType::kFloat32, &b, &a, 1), 0u);
  float nan = NAN;
  EXPECT_EQ(CountWrong(DataType::kFloat32, &nan, &a, 1), 1u);
}

TEST(DataCheckTest, ExpectedRegionsPerOp) {
  const int n = 4;
  OpLayout ag = LayoutFor(PerfOp::kAllGather, 1024, 4, n);
  std::vector<ExpectedRegion> regions = ExpectedRegions(PerfOp::kAllGather, ag, 1, n, 0, false);
  ASSERT_EQ(regions.size(), 4u);
  EXPECT_EQ(regions[2].offset, 128u);
  EXPECT_EQ(regions[2].source_rank, 2);
  EXPECT_EQ(regions[2].first, 0u);

  OpLayout a2a = LayoutFor(PerfOp::kAllToAll, 1024, 4, n);
  regions = ExpectedRegions(PerfOp::kAllToAll, a2a, 1, n, 0, false);
  ASSERT_EQ(regions.size(), 4u);
  EXPECT_EQ(regions[3].offset, 192u);
  EXPECT_EQ(regions[3].first, 64u);  // rank 3's block for rank 1

  OpLayout rs = LayoutFor(PerfOp::kReduceScatter, 1024, 4, n);
  regions = ExpectedRegions(PerfOp::kReduceScatter, rs, 2, n, 0, true);
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].source_rank, ExpectedRegion::kReduced);
  EXPECT_EQ(regions[0].offset, 128u);
  EXPECT_EQ(regions[0].first, 128u);

  OpLayout red = LayoutFor(PerfOp::kReduce, 1024, 4, n);
  EXPECT_TRUE(ExpectedRegions(PerfOp::kReduce, red, 1, n, 2, false).empty());
  EXPECT_EQ(ExpectedRegions(PerfOp::kReduce, red, 2, n, 2, false).size(), 1u);
  EXPECT_EQ(ExpectedRegions(PerfOp::kBroadcast, red, 1, n, 2, false)[0].source_rank, 2);
  EXPECT_EQ(ExpectedRegions(PerfOp::kSendRecv, red, 0, n, 0, false)[0].source_rank, 3);
  EXPECT_TRUE(ExpectedRegions(PerfOp::kBarrier, OpLayout{}, 0, n, 0, false).empty());
}

TEST(ResultTableTest, MatchesNcclTestsColumns) {
  EXPECT_EQ(FormatRowPrefix(1048576, 262144, "float", "sum", -1),
            "     1048576        262144     float     sum      -1");
  EXPECT_EQ(FormatResult(105.9, 9.90, 17.33, 0), "   105.90    9.90   17.33       0");
  EXPECT_EQ(FormatResult(5.63, 0.0, 0.0, -1), "     5.63    0.00    0.00    N/A");
  // nccl-tests' getFloatStr: 2 decimals while they fit the column, then 1, 0, an exponent.
  EXPECT_EQ(FormatTime(90330.4), "90330.4");
  EXPECT_EQ(FormatTime(1234.567), "1234.57");
  EXPECT_EQ(FormatTime(99.994), "  99.99");
  EXPECT_EQ(FormatTime(123456789.0), "1.2e+08");
  EXPECT_EQ(FormatFloat(1234.5, 6), "1234.5");
  EXPECT_EQ(FormatFloat(123456.0, 6), "123456");
  const std::string header = FormatColumnHeader();
  EXPECT_EQ(header,
            "#\n"
            "#                                                              out-of-place           "
            "            in-place          \n"
            "#       size         count      type   redop    root     time   algbw   busbw  "
            "#wrong     time   algbw   busbw  #wrong \n"
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       "
            "      (us)  (GB/s)  (GB/s)         \n");
  EXPECT_EQ(FormatFooter(0, 12.5, -1, "all_reduce_perf"),
            "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 12.5 \n#\n"
            "# Collective test concluded: all_reduce_perf\n#\n\n");
  EXPECT_EQ(FormatFooter(2, 12.5, 10, "all_gather_perf"),
            "# Out of bounds values : 2 FAILED\n# Avg bus bandwidth    : 12.5 OK\n#\n"
            "# Collective test concluded: all_gather_perf\n#\n\n");
  EXPECT_FALSE(BelowMinBw(12.5, 13.8));  // 90% of 13.8 is 12.42
  EXPECT_TRUE(BelowMinBw(12.5, 14));
  EXPECT_FALSE(BelowMinBw(0, -1));
  EXPECT_DOUBLE_EQ(AlgBw(2e9, 1.0), 2.0);
  EXPECT_EQ(AlgBw(100, 0), 0.0);
}

TEST(ResultTableTest, RunHeaderIsNcclTests219s) {
  RunHeader h;
  h.program = "all_reduce_perf";
  h.min_bytes = 8;
  h.max_bytes = 134217728;
  h.step_factor = 2;
  h.warmup_iters = 5;
  h.iters = 20;
  std::vector<RankLine> ranks = {{0, 4242, "nodea", -1, "host memory, railyardd"},
                                 {1, 4243, "nodeb", -1, "host memory, railyardd"}};
  EXPECT_EQ(FormatRunHeader(h, ranks),
            "# nccl-tests version 2.19.0 nccl-headers=22809 nccl-library=22809\n"
            "# Collective test starting: all_reduce_perf\n"
            "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 "
            "iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n"
            "#\n"
            "# Using devices\n"
            "#  Rank  0 Group  0 Pid   4242 on      nodea device -1 [0000:00:00] host memory, "
            "railyardd\n"
            "#  Rank  1 Group  0 Pid   4243 on      nodeb device -1 [0000:00:00] host memory, "
            "railyardd\n");
  h.step_factor = 1;
  h.step_bytes = 1048576;
  h.blocking = 1;
  const std::string blocking = FormatRunHeader(h, {});
  EXPECT_NE(blocking.find("step: 1048576(bytes)"), std::string::npos) << blocking;
  EXPECT_NE(
      blocking.find("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n"),
      std::string::npos);
  EXPECT_EQ(ProgramName(PerfOp::kReduceScatter), "reduce_scatter_perf");
  EXPECT_EQ(ProgramName(PerfOp::kAllGather), "all_gather_perf");
}

TEST(ParsePerfArgsTest, NcclTestsTGMNAZGFlags) {
  absl::StatusOr<PerfArgs> a =
      Parse({"-t", "1", "-g", "4", "-m", "8", "-N", "3", "-a", "1", "-z", "1", "-G", "0"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ranks_per_daemon, 4);  // -g: ranks per daemon here
  EXPECT_EQ(a->ngpus, 4);
  EXPECT_EQ(a->agg_iters, 8);
  EXPECT_EQ(a->run_cycles, 3);
  EXPECT_EQ(a->average, 1);
  EXPECT_EQ(a->blocking, 1);
  EXPECT_EQ(Parse({})->average, 3);  // the slowest rank unless asked
  struct Bad {
    std::vector<std::string> args;
    const char* says;
  };
  for (const Bad& bad : std::vector<Bad>{
           {{"-t", "2"}, "every rank is a process of its own"},
           {{"-G", "1"}, "does not launch through CUDA graphs"},
           {{"-N", "0"}, "run forever"},
           {{"-z", "2"}, "only -z 0"},
           {{"-a", "4"}, "out of range"},
           {{"-g", "2", "--ranks-per-daemon", "3"}, "disagrees with --ranks-per-daemon 3"},
           {{"-m", "0"}, "out of range"},
       }) {
    absl::StatusOr<PerfArgs> r = Parse(bad.args);
    ASSERT_FALSE(r.ok()) << bad.args[0];
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(r.status().message()).find(bad.says), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace railyard::perf
