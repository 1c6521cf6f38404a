// The operation digest daemons exchange before a multi-node collective (daemon/comm/op_digest.h):
// what it encodes, what a peer may not send, and how a disagreement is worded.
#include "daemon/comm/op_digest.h"

#include <cstring>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

scheduler::RankRequest AllReduce(uint64_t count) {
  scheduler::RankRequest r;
  r.op = scheduler::OpKind::kAllReduce;
  r.dtype = kernels::DataType::kFloat32;
  r.red_op = kernels::RedOp::kSum;
  r.count = count;
  return r;
}

TEST(OpDigestTest, RoundTripsEveryField) {
  scheduler::RankRequest r;
  r.op = scheduler::OpKind::kBroadcast;
  r.dtype = kernels::DataType::kBFloat16;
  r.count = 12345;
  r.root = 7;
  const OpDigest d = OpDigest::Of(r, 99, "ring");
  absl::StatusOr<OpDigest> back = OpDigest::Decode(d.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->op, scheduler::OpKind::kBroadcast);
  EXPECT_EQ(back->dtype, kernels::DataType::kBFloat16);
  EXPECT_FALSE(back->has_red_op);
  EXPECT_EQ(back->root, 7);
  EXPECT_EQ(back->count, 12345u);
  EXPECT_EQ(back->seq, 99u);
  EXPECT_EQ(back->algorithm, "ring");
  EXPECT_EQ(back->Differs(d), "");
  EXPECT_EQ(back->Describe(), "broadcast bfloat16 count=12345 (24690 B) root=7");
}

TEST(OpDigestTest, TheFirstDifferingFieldIsNamed) {
  const OpDigest a = OpDigest::Of(AllReduce(1024), 3, "hier");
  EXPECT_EQ(a.Differs(OpDigest::Of(AllReduce(2048), 3, "hier")), "count");
  EXPECT_EQ(a.Differs(OpDigest::Of(AllReduce(1024), 4, "hier")), "seq");
  EXPECT_EQ(a.Differs(OpDigest::Of(AllReduce(1024), 3, "ring")), "algorithm");
  scheduler::RankRequest max = AllReduce(1024);
  max.red_op = kernels::RedOp::kMax;
  EXPECT_EQ(a.Differs(OpDigest::Of(max, 3, "hier")), "red_op");
  scheduler::RankRequest gather = AllReduce(1024);
  gather.op = scheduler::OpKind::kAllGather;
  EXPECT_EQ(a.Differs(OpDigest::Of(gather, 3, "hier")), "op");
  // A root means nothing to an AllReduce, and AllToAllv counts differ per rank by design.
  scheduler::RankRequest rooted = AllReduce(1024);
  rooted.root = 5;
  EXPECT_EQ(a.Differs(OpDigest::Of(rooted, 3, "hier")), "");
  scheduler::RankRequest v1 = AllReduce(10), v2 = AllReduce(20);
  v1.op = v2.op = scheduler::OpKind::kAllToAllv;
  EXPECT_EQ(OpDigest::Of(v1, 0, "direct").Differs(OpDigest::Of(v2, 0, "direct")), "");
}

TEST(OpDigestTest, TheCodecTravelsAndADifferentOneIsNamed) {
  auto codec = [](const char* name) { return *kernels::ParseCodec(name); };
  const OpDigest a = OpDigest::Of(AllReduce(1024), 3, "compressed", codec("int8:64"));
  absl::StatusOr<OpDigest> back = OpDigest::Decode(a.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->codec.kind, kernels::CodecKind::kInt8);
  EXPECT_EQ(back->codec.block, 64u);
  EXPECT_EQ(back->Differs(a), "");
  EXPECT_THAT(back->Describe(), HasSubstr("compressed int8:64"));
  const OpDigest t = OpDigest::Of(AllReduce(1024), 3, "compressed", codec("topk:0.01"));
  back = OpDigest::Decode(t.Encode());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->Differs(t), "");
  EXPECT_EQ(a.Differs(OpDigest::Of(AllReduce(1024), 3, "compressed", codec("int8"))),
            "compression");
  EXPECT_EQ(t.Differs(OpDigest::Of(AllReduce(1024), 3, "compressed", codec("topk:0.02"))),
            "compression");
  EXPECT_EQ(a.Differs(OpDigest::Of(AllReduce(1024), 3, "compressed", codec("fp16"))),
            "compression");
  // A codec this daemon does not know is refused.
  OpDigest::Wire w = a.Encode();
  w[56] = std::byte{9};
  EXPECT_EQ(OpDigest::Decode(w).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OpDigestTest, WhatNoDaemonSendsIsRefusedSayingWhat) {
  const OpDigest::Wire good = OpDigest::Of(AllReduce(8), 0, "ring").Encode();
  struct Case {
    size_t offset;
    uint8_t value;
    const char* says;
  };
  const Case cases[] = {{0, 0x00, "bad magic"},
                        {4, 9, "version 9"},
                        {5, 200, "op 200 out of range"},
                        {6, 77, "dtype 77 out of range"},
                        {7, 42, "red_op 42 out of range"},
                        {33, 0x07, "not printable"}};
  for (const Case& c : cases) {
    OpDigest::Wire w = good;
    std::memcpy(w.data() + c.offset, &c.value, 1);
    absl::StatusOr<OpDigest> d = OpDigest::Decode(w);
    ASSERT_FALSE(d.ok()) << c.says;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(d.status().message(), HasSubstr(c.says));
  }
  OpDigest::Wire zeros{};
  EXPECT_FALSE(OpDigest::Decode(zeros).ok());
  // Codec parameters no codec takes: an int8 block outside [8, 65536], a topk ratio outside
  // (0, 1] or NaN (found by digest_summary_fuzz: a NaN ratio differs even from itself).
  const auto with_param = [&](uint8_t codec, uint32_t bits) {
    OpDigest::Wire w = good;
    w[56] = std::byte{codec};
    std::memcpy(w.data() + 60, &bits, sizeof bits);
    return OpDigest::Decode(w);
  };
  const auto float_bits = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
  };
  const uint8_t int8 = static_cast<uint8_t>(kernels::CodecKind::kInt8);
  const uint8_t topk = static_cast<uint8_t>(kernels::CodecKind::kTopK);
  EXPECT_TRUE(with_param(int8, 64).ok());
  EXPECT_THAT(with_param(int8, 4).status().message(), HasSubstr("int8 block 4 out of range"));
  EXPECT_THAT(with_param(int8, 1u << 20).status().message(), HasSubstr("out of range"));
  EXPECT_TRUE(with_param(topk, float_bits(0.01f)).ok());
  for (float bad : {0.0f, -0.5f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_THAT(with_param(topk, float_bits(bad)).status().message(),
                HasSubstr("topk ratio out of (0, 1]"))
        << bad;
  }
}

TEST(OpDigestTest, ADisagreementNamesBothSidesRanksAndWhatDiffers) {
  scheduler::RankRequest gather = AllReduce(1024);
  gather.op = scheduler::OpKind::kAllGather;
  const absl::Status s =
      DisagreementError(88, "n1", {2, 3}, OpDigest::Of(AllReduce(1024), 88, "hier"), "n2", {4, 5},
                        OpDigest::Of(gather, 88, "direct"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "nodes disagree at seq 88 on op: n2 ranks 4-5 submitted allgather float count=1024 "
            "(4 KiB); n1 ranks 2-3 submitted allreduce float count=1024 (4 KiB) sum");
  const absl::Status algo = DisagreementError(1, "n0", {0}, OpDigest::Of(AllReduce(8), 1, "ring"),
                                              "n1", {1}, OpDigest::Of(AllReduce(8), 1, "tree"));
  EXPECT_THAT(algo.message(), HasSubstr("on algorithm: n1 ranks 1 submitted allreduce float "
                                        "count=8 (32 B) sum by tree; n0 ranks 0"));
}

}  // namespace
}  // namespace railyard
