// Tests for the data plane's frame (daemon/transport/framed_endpoint.h) and the test-only bit
// flipper (bit_flip_endpoint.h), over the in-process fabric: the wire format, the CRC catching
// every flipped bit with no false positives, and foreign messages (wrong secret, magic or length)
// dropped while the member's message still lands.

#include "daemon/transport/framed_endpoint.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/transport/bit_flip_endpoint.h"
#include "daemon/transport/crc32c.h"
#include "daemon/transport/inproc/inproc_transport.h"

namespace railyard::transport {
namespace {

constexpr uint64_t kSecret = 0x0123456789ABCDEFull;
constexpr absl::Duration kWait = absl::Seconds(20);

struct Result {
  absl::Notification done;
  absl::Status status = absl::UnknownError("not completed");
  size_t length = 0;
};

// a sends to b; ab_raw / ba_raw are the fabric's endpoints, framed ones wrap them.
struct Link {
  std::shared_ptr<InProcFabric> fabric = InProcFabric::Create();
  std::unique_ptr<InProcTransport> a, b;
  std::shared_ptr<Endpoint> ab_raw, ba_raw;
  std::shared_ptr<Endpoint> spoofer;  // a third transport's endpoint to b
  std::unique_ptr<InProcTransport> c;
  std::atomic<int> rejected{0};
  std::atomic<int> integrity_errors{0};
  absl::Mutex mu;
  std::string last_rejection ABSL_GUARDED_BY(mu);

  // Rejections are counted on the fabric thread, after the spoofer's send completed.
  bool WaitRejected(int n) {
    for (int i = 0; i < 2000 && rejected.load() < n; ++i) absl::SleepFor(absl::Milliseconds(5));
    return rejected.load() == n;
  }
  std::string LastRejection() {
    absl::MutexLock lock(&mu);
    return last_rejection;
  }

  Link() {
    a = *fabric->NewTransport("a", 1);
    b = *fabric->NewTransport("b", 1);
    c = *fabric->NewTransport("mallory", 1);
    ab_raw = *a->Connect(*b->LocalAddress(0), 0);
    ba_raw = *b->Connect(*a->LocalAddress(0), 0);
    spoofer = *c->Connect(*b->LocalAddress(0), 0);
  }
  FramedEndpoint::Options Options(Integrity integrity, const std::string& node,
                                  const std::string& peer) {
    FramedEndpoint::Options o;
    o.secret = kSecret;
    o.integrity = integrity;
    o.node = node;
    o.peer = peer;
    o.rail = "rail0";
    o.max_rejections = 4;
    o.on_rejected = [this](const absl::Status& s) {
      {
        absl::MutexLock lock(&mu);
        last_rejection = std::string(s.message());
      }
      ++rejected;
    };
    o.on_integrity_error = [this] { ++integrity_errors; };
    return o;
  }
  // Options that split from 64 KiB rather than kDefaultSplitMinBytes: the split frame's
  // mechanics at sizes that keep these tests quick.
  FramedEndpoint::Options SplitOptions(Integrity integrity, const std::string& node,
                                       const std::string& peer) {
    FramedEndpoint::Options o = Options(integrity, node, peer);
    o.split_min_bytes = 64 * 1024;
    return o;
  }
};

std::vector<uint8_t> Random(size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(size);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

bool SendAndWait(Endpoint& ep, Tag tag, const void* data, size_t size) {
  Result r;
  ep.Send(tag, data, size, [&](absl::Status s) {
    r.status = std::move(s);
    r.done.Notify();
  });
  return r.done.WaitForNotificationWithTimeout(kWait) && r.status.ok();
}

void PostRecv(Endpoint& ep, Tag tag, void* data, size_t size, Result* r) {
  ep.Recv(tag, data, size, [r](absl::Status s) {
    r->status = std::move(s);
    r->done.Notify();
  });
}

TEST(FramedEndpointTest, WireFormatIsPayloadThenSecretCrcMagic) {
  Link l;
  // By default every unsplit frame goes out as an iov (payload, trailer); with
  // contiguous_send_min_bytes 64 KiB, 100000 B go out as one contiguous bounce buffer instead:
  // the same bytes either way.
  Tag tag = 100;
  for (size_t contiguous_min : {size_t{0}, size_t{64} << 10})
    for (size_t size : {size_t{1000}, size_t{100000}}) {
      SCOPED_TRACE(absl::StrCat("contiguous from ", contiguous_min, ", ", size, " B"));
      FramedEndpoint::Options options = l.Options(Integrity::kCrc32c, "a", "b");
      options.split_min_bytes = 0;
      options.contiguous_send_min_bytes = contiguous_min;
      FramedEndpoint sender(l.ab_raw, std::move(options));
      const std::vector<uint8_t> payload = Random(size, size);
      std::vector<uint8_t> wire(payload.size() + kFrameTrailerSize);
      Result r;
      ++tag;
      PostRecv(*l.ba_raw, tag, wire.data(), wire.size(), &r);
      ASSERT_TRUE(SendAndWait(sender, tag, payload.data(), payload.size()));
      ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
      ASSERT_TRUE(r.status.ok()) << r.status;
      EXPECT_TRUE(std::equal(payload.begin(), payload.end(), wire.begin()));
      const uint8_t* t = wire.data() + payload.size();
      uint64_t secret = 0;
      uint32_t crc = 0, magic = 0;
      for (int i = 0; i < 8; ++i) secret |= uint64_t{t[i]} << (8 * i);
      for (int i = 0; i < 4; ++i) crc |= uint32_t{t[8 + i]} << (8 * i);
      for (int i = 0; i < 4; ++i) magic |= uint32_t{t[12 + i]} << (8 * i);
      EXPECT_EQ(secret, kSecret);
      EXPECT_EQ(crc, Crc32c(payload.data(), payload.size()));
      EXPECT_EQ(magic, 0x52590101u);
    }

  const std::vector<uint8_t> payload = Random(1000, 1);
  std::vector<uint8_t> wire(payload.size() + kFrameTrailerSize);
  // Without integrity: no CRC, no flag.
  FramedEndpoint plain(l.ab_raw, l.Options(Integrity::kNone, "a", "b"));
  Result r2;
  PostRecv(*l.ba_raw, 8, wire.data(), wire.size(), &r2);
  ASSERT_TRUE(SendAndWait(plain, 8, payload.data(), payload.size()));
  ASSERT_TRUE(r2.done.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(r2.status.ok()) << r2.status;
  EXPECT_EQ(wire[payload.size() + 8], 0);
  EXPECT_EQ(wire[payload.size() + 12], 0x00);
  EXPECT_EQ(wire[payload.size() + 13], 0x01);
}

// From split_min_bytes (kDefaultSplitMinBytes by default): the payload as a message of its own,
// then the trailer (flag split).
TEST(FramedEndpointTest, LargePayloadsTravelAsPayloadThenTrailer) {
  Link l;
  for (Integrity integrity : {Integrity::kNone, Integrity::kCrc32c}) {
    FramedEndpoint sender(l.ab_raw, l.Options(integrity, "a", "b"));
    const size_t size = kDefaultSplitMinBytes + 1000;
    const Tag tag = 17 + static_cast<int>(integrity);
    const std::vector<uint8_t> payload = Random(size, 2);
    std::vector<uint8_t> got(size), trailer(kFrameTrailerSize + 8);
    Result rp, rt;
    PostRecv(*l.ba_raw, tag, got.data(), got.size(), &rp);
    // The trailer's receive takes more than 16 bytes so that its length shows.
    const Segment in{trailer.data(), trailer.size()};
    l.ba_raw->RecvV(tag, &in, 1, [&](absl::Status s, size_t length) {
      rt.status = std::move(s);
      rt.length = length;
      rt.done.Notify();
    });
    ASSERT_TRUE(SendAndWait(sender, tag, payload.data(), payload.size()));
    ASSERT_TRUE(rp.done.WaitForNotificationWithTimeout(kWait));
    ASSERT_TRUE(rt.done.WaitForNotificationWithTimeout(kWait));
    ASSERT_TRUE(rp.status.ok()) << rp.status;
    ASSERT_TRUE(rt.status.ok()) << rt.status;
    EXPECT_EQ(got, payload);
    EXPECT_EQ(rt.length, kFrameTrailerSize);
    unsigned char want[kFrameTrailerSize];
    const Segment seg{const_cast<uint8_t*>(payload.data()), payload.size()};
    WriteFrameTrailer(kSecret, integrity, &seg, 1, want, kFrameFlagSplit);
    EXPECT_EQ(0, std::memcmp(trailer.data(), want, kFrameTrailerSize));
    EXPECT_EQ(trailer[12], integrity == Integrity::kCrc32c ? 0x03 : 0x02);
  }
}

TEST(FramedEndpointTest, RoundTripsEverySizeWithAndWithoutCrc) {
  for (Integrity integrity : {Integrity::kNone, Integrity::kCrc32c}) {
    Link l;
    FramedEndpoint sender(l.ab_raw, l.Options(integrity, "a", "b"));
    FramedEndpoint receiver(l.ba_raw, l.Options(integrity, "b", "a"));
    Tag tag = 1;
    for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{65535}, size_t{65536},
                        size_t{65537}, kDefaultSplitMinBytes - 1, kDefaultSplitMinBytes,
                        size_t{1} << 20, (size_t{3} << 20) + 7}) {
      const std::vector<uint8_t> payload = Random(size, size);
      std::vector<uint8_t> got(size, 0);
      Result r;
      PostRecv(receiver, tag, got.data(), got.size(), &r);
      ASSERT_TRUE(SendAndWait(sender, tag, payload.data(), payload.size()));
      ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
      EXPECT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(got, payload) << "size " << size;
      ++tag;
    }
    EXPECT_EQ(l.rejected.load(), 0);
    EXPECT_EQ(l.integrity_errors.load(), 0);
  }
}

// Issue item 6: one flipped bit per message, at random positions and sizes, is caught every
// time with CRC on; clean messages never fail.
TEST(FramedEndpointTest, CrcCatchesEveryFlippedBitAndNeverACleanMessage) {
  Link l;
  auto flipper =
      std::make_shared<BitFlipEndpoint>(l.ab_raw, /*every=*/2, /*seed=*/42, kFrameTrailerSize);
  FramedEndpoint sender(flipper, l.Options(Integrity::kCrc32c, "b", "a"));
  FramedEndpoint receiver(l.ba_raw, l.Options(Integrity::kCrc32c, "b", "a"));
  std::mt19937_64 rng(9);
  constexpr int kMessages = 4000;  // every 2nd flipped: 2000 corrupted, 2000 clean
  int data_loss = 0, ok = 0, wrong = 0;
  for (int i = 0; i < kMessages; ++i) {
    const size_t size = 1 + rng() % (i % 10 == 0 ? 300000 : 2048);
    const std::vector<uint8_t> payload = Random(size, i);
    std::vector<uint8_t> got(size, 0);
    Result r;
    PostRecv(receiver, 100 + i, got.data(), got.size(), &r);
    ASSERT_TRUE(SendAndWait(sender, 100 + i, payload.data(), payload.size()));
    ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
    const bool flipped = (i + 1) % 2 == 0;
    if (flipped) {
      ASSERT_TRUE(absl::IsDataLoss(r.status)) << "message " << i << ": " << r.status;
      EXPECT_TRUE(absl::StartsWith(r.status.message(),
                                   "integrity check failed on link b <- a rail rail0: CRC-32C"))
          << r.status;
      ++data_loss;
    } else {
      ASSERT_TRUE(r.status.ok()) << "message " << i << ": " << r.status;
      wrong += got != payload;
      ++ok;
    }
  }
  EXPECT_EQ(data_loss, kMessages / 2);
  EXPECT_EQ(ok, kMessages / 2);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(flipper->flipped(), static_cast<uint64_t>(kMessages / 2));
  EXPECT_EQ(l.integrity_errors.load(), kMessages / 2);
  EXPECT_EQ(l.rejected.load(), 0);
}

// Without CRC the same injector's flips go through: the received data differs in exactly one
// bit, and nothing notices (what --integrity=crc32c is for).
TEST(FramedEndpointTest, WithoutCrcAFlippedBitArrivesAsWrongData) {
  Link l;
  auto flipper =
      std::make_shared<BitFlipEndpoint>(l.ab_raw, /*every=*/1, /*seed=*/5, kFrameTrailerSize);
  FramedEndpoint sender(flipper, l.Options(Integrity::kNone, "b", "a"));
  FramedEndpoint receiver(l.ba_raw, l.Options(Integrity::kNone, "b", "a"));
  for (int i = 0; i < 50; ++i) {
    const std::vector<uint8_t> payload = Random(4096, 1000 + i);
    const std::vector<uint8_t> copy = payload;
    std::vector<uint8_t> got(payload.size(), 0);
    Result r;
    PostRecv(receiver, 1 + i, got.data(), got.size(), &r);
    ASSERT_TRUE(SendAndWait(sender, 1 + i, payload.data(), payload.size()));
    ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(payload, copy) << "the injector must never write the caller's buffer";
    int bits = 0;
    for (size_t k = 0; k < got.size(); ++k) bits += __builtin_popcount(got[k] ^ payload[k]);
    EXPECT_EQ(bits, 1) << "message " << i;
    const uint64_t bit = flipper->last_bit();
    EXPECT_NE(got[bit / 8], payload[bit / 8]);
  }
}

// A message that matches the tag but is not a member's is dropped and the receive re-posted.
TEST(FramedEndpointTest, SpoofedMessagesAreDroppedAndTheRealOneLands) {
  Link l;
  FramedEndpoint sender(l.ab_raw, l.Options(Integrity::kCrc32c, "a", "b"));
  FramedEndpoint receiver(l.ba_raw, l.Options(Integrity::kCrc32c, "b", "a"));
  const std::vector<uint8_t> payload = Random(2048, 3);
  std::vector<uint8_t> got(payload.size(), 0);
  Result r;
  PostRecv(receiver, 55, got.data(), got.size(), &r);

  // 1: right length and magic, wrong secret (with a valid CRC of its payload).
  std::vector<uint8_t> forged = Random(payload.size(), 4);
  {
    const Segment seg{forged.data(), forged.size()};
    std::vector<uint8_t> frame(forged);
    frame.resize(forged.size() + kFrameTrailerSize);
    WriteFrameTrailer(kSecret ^ 1, Integrity::kCrc32c, &seg, 1, frame.data() + forged.size());
    ASSERT_TRUE(SendAndWait(*l.spoofer, 55, frame.data(), frame.size()));
  }
  // 2: a bare payload of the frame's length (no trailer magic).
  std::vector<uint8_t> bare(payload.size() + kFrameTrailerSize, 0x5A);
  ASSERT_TRUE(SendAndWait(*l.spoofer, 55, bare.data(), bare.size()));
  // 3: too short, 4: too long.
  ASSERT_TRUE(SendAndWait(*l.spoofer, 55, bare.data(), 10));
  std::vector<uint8_t> longer(payload.size() + 100, 1);
  ASSERT_TRUE(SendAndWait(*l.spoofer, 55, longer.data(), longer.size()));
  EXPECT_TRUE(l.WaitRejected(4)) << l.rejected.load();
  EXPECT_FALSE(r.done.HasBeenNotified()) << r.status;
  const std::string last = l.LastRejection();
  EXPECT_TRUE(absl::StrContains(last, "link b <- a rail rail0")) << last;
  EXPECT_TRUE(absl::StrContains(last, "longer than")) << last;

  ASSERT_TRUE(SendAndWait(sender, 55, payload.data(), payload.size()));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(got, payload);
  EXPECT_EQ(l.integrity_errors.load(), 0);
}

void PostRecvV(Endpoint& ep, Tag tag, const Segment* segments, int count, Result* r) {
  ep.RecvV(tag, segments, count, [r](absl::Status s, size_t length) {
    r->status = std::move(s);
    r->length = length;
    r->done.Notify();
  });
}

// RecvV's contract: a shorter message fills the first bytes and reports its length. A member's
// shorter frame is accepted wherever its trailer lands among the receive's segments (in the
// first, across the first and the second, in the second), its CRC checked over what it carried.
TEST(FramedEndpointTest, AShorterFrameFillsTheFirstBytesAndReportsItsLength) {
  for (const Integrity integrity : {Integrity::kNone, Integrity::kCrc32c}) {
    for (const size_t sent : {size_t{0}, size_t{1}, size_t{40}, size_t{63}, size_t{64}, size_t{70},
                              size_t{100}, size_t{127}}) {
      Link l;
      FramedEndpoint sender(l.ab_raw, l.Options(integrity, "a", "b"));
      FramedEndpoint receiver(l.ba_raw, l.Options(integrity, "b", "a"));
      const std::vector<uint8_t> payload = Random(sent, 7 + sent);
      std::vector<uint8_t> head(64, 0xEE), tail(64, 0xEE);
      const Segment segs[2] = {{head.data(), head.size()}, {tail.data(), tail.size()}};
      Result r;
      PostRecvV(receiver, 9, segs, 2, &r);
      Result s;
      sender.Send(9, payload.data(), payload.size(), [&s](absl::Status st) {
        s.status = std::move(st);
        s.done.Notify();
      });
      ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait)) << sent;
      ASSERT_TRUE(r.status.ok()) << sent << ": " << r.status;
      EXPECT_EQ(r.length, sent);
      std::vector<uint8_t> got(head);
      got.insert(got.end(), tail.begin(), tail.end());
      got.resize(sent);
      EXPECT_EQ(got, payload) << sent;
      EXPECT_EQ(l.rejected.load(), 0);
      EXPECT_EQ(l.integrity_errors.load(), 0);
    }
  }
}

TEST(FramedEndpointTest, AShorterFrameStillNeedsTheSecretAndItsCrc) {
  Link l;
  FramedEndpoint receiver(l.ba_raw, l.Options(Integrity::kCrc32c, "b", "a"));
  std::vector<uint8_t> got(256, 0);
  Result r;
  PostRecvV(receiver, 12, std::vector<Segment>{{got.data(), got.size()}}.data(), 1, &r);
  // A foreign shorter frame: 32 bytes of payload with another secret, then 20 bytes of payload
  // with the right secret but a CRC over other bytes.
  const std::vector<uint8_t> forged = Random(32, 5);
  const Segment fseg{const_cast<uint8_t*>(forged.data()), forged.size()};
  std::vector<uint8_t> frame(forged);
  frame.resize(forged.size() + kFrameTrailerSize);
  WriteFrameTrailer(kSecret ^ 1, Integrity::kCrc32c, &fseg, 1, frame.data() + forged.size());
  ASSERT_TRUE(SendAndWait(*l.spoofer, 12, frame.data(), frame.size()));
  EXPECT_TRUE(l.WaitRejected(1)) << l.rejected.load();
  EXPECT_FALSE(r.done.HasBeenNotified()) << r.status;
  std::vector<uint8_t> flipped = Random(20, 6);
  const Segment gseg{flipped.data(), flipped.size()};
  std::vector<uint8_t> bad(flipped);
  bad.resize(flipped.size() + kFrameTrailerSize);
  WriteFrameTrailer(kSecret, Integrity::kCrc32c, &gseg, 1, bad.data() + flipped.size());
  bad[3] ^= 0x10;  // after the CRC was computed
  ASSERT_TRUE(SendAndWait(*l.spoofer, 12, bad.data(), bad.size()));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss) << r.status;
  EXPECT_TRUE(absl::StrContains(r.status.message(), "of the 20-byte message")) << r.status;
  EXPECT_EQ(l.integrity_errors.load(), 1);
}

// Endpoint::Recv wants exactly its size: a member's shorter message fails it at once, saying
// both lengths, instead of being dropped as foreign and leaving the receive to its deadline.
TEST(FramedEndpointTest, AnExactReceiveRefusesAShorterMembersMessage) {
  Link l;
  FramedEndpoint sender(l.ab_raw, l.Options(Integrity::kNone, "a", "b"));
  FramedEndpoint receiver(l.ba_raw, l.Options(Integrity::kNone, "b", "a"));
  std::vector<uint8_t> got(36, 0);
  Result r;
  PostRecv(receiver, 3, got.data(), got.size(), &r);
  const std::vector<uint8_t> payload = Random(32, 8);
  ASSERT_TRUE(SendAndWait(sender, 3, payload.data(), payload.size()));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInternal) << r.status;
  EXPECT_TRUE(absl::StrContains(r.status.message(), "received 32 bytes")) << r.status;
  EXPECT_TRUE(absl::StrContains(r.status.message(), "expected 36")) << r.status;
  EXPECT_EQ(l.rejected.load(), 0);
}

TEST(FramedEndpointTest, TooManyForeignMessagesFailTheReceiveWithPermissionDenied) {
  Link l;
  FramedEndpoint receiver(l.ba_raw, l.Options(Integrity::kNone, "b", "a"));  // max 4
  std::vector<uint8_t> got(64, 0);
  Result r;
  PostRecv(receiver, 9, got.data(), got.size(), &r);
  std::vector<uint8_t> junk(64 + kFrameTrailerSize, 0);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(SendAndWait(*l.spoofer, 9, junk.data(), junk.size()));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(absl::IsPermissionDenied(r.status)) << r.status;
  EXPECT_TRUE(absl::StrContains(r.status.message(), "on link b <- a rail rail0 dropped 5 messages"))
      << r.status;
  EXPECT_EQ(l.rejected.load(), 5);
}

TEST(FramedEndpointTest, AMessageWithoutCrcFailsWhereCrcIsRequired) {
  Link l;
  FramedEndpoint sender(l.ab_raw, l.Options(Integrity::kNone, "a", "b"));
  FramedEndpoint receiver(l.ba_raw, l.Options(Integrity::kCrc32c, "b", "a"));
  std::vector<uint8_t> payload(32, 7), got(32, 0);
  Result r;
  PostRecv(receiver, 3, got.data(), got.size(), &r);
  ASSERT_TRUE(SendAndWait(sender, 3, payload.data(), payload.size()));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(absl::IsDataLoss(r.status)) << r.status;
  EXPECT_TRUE(absl::StrContains(r.status.message(), "carries no CRC-32C")) << r.status;
  EXPECT_EQ(l.integrity_errors.load(), 1);
}

// Large messages' CRCs are verified where offload runs them (the daemon's executor), small ones
// on the transport thread; both still catch a flipped bit.
TEST(FramedEndpointTest, LargeMessagesAreVerifiedOnTheOffloadThread) {
  Link l;
  auto flipper =
      std::make_shared<BitFlipEndpoint>(l.ab_raw, /*every=*/2, /*seed=*/3, kFrameTrailerSize);
  FramedEndpoint::Options o = l.Options(Integrity::kCrc32c, "b", "a");
  std::atomic<int> offloaded{0};
  std::vector<std::thread> threads;
  absl::Mutex threads_mu;
  o.offload = [&](std::function<void()> task) {
    ++offloaded;
    absl::MutexLock lock(&threads_mu);
    threads.emplace_back(std::move(task));
  };
  o.offload_min_bytes = 1000;
  FramedEndpoint sender(flipper, l.Options(Integrity::kCrc32c, "a", "b"));
  FramedEndpoint receiver(l.ba_raw, std::move(o));
  for (int i = 0; i < 8; ++i) {
    const size_t size = i < 4 ? 100 : 5000;  // 4 inline, 4 offloaded; every second flipped
    const std::vector<uint8_t> payload = Random(size, 77 + i);
    std::vector<uint8_t> got(size, 0);
    Result r;
    PostRecv(receiver, 300 + i, got.data(), got.size(), &r);
    ASSERT_TRUE(SendAndWait(sender, 300 + i, payload.data(), payload.size()));
    ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
    if (i % 2 == 1) {
      EXPECT_TRUE(absl::IsDataLoss(r.status)) << i << ": " << r.status;
    } else {
      EXPECT_TRUE(r.status.ok()) << i << ": " << r.status;
      EXPECT_EQ(got, payload);
    }
  }
  EXPECT_EQ(offloaded.load(), 4);
  EXPECT_EQ(l.integrity_errors.load(), 4);
  absl::MutexLock lock(&threads_mu);
  for (auto& t : threads) t.join();
}

// The split path (payload, then trailer) under one flipped bit per second message: every flip is
// a DATA_LOSS, every clean message exact.
TEST(FramedEndpointTest, SplitFramesCatchEveryFlippedBit) {
  Link l;
  auto flipper =
      std::make_shared<BitFlipEndpoint>(l.ab_raw, /*every=*/2, /*seed=*/11, kFrameTrailerSize);
  FramedEndpoint sender(flipper, l.SplitOptions(Integrity::kCrc32c, "a", "b"));
  FramedEndpoint receiver(l.ba_raw, l.SplitOptions(Integrity::kCrc32c, "b", "a"));
  std::mt19937_64 rng(12);
  constexpr int kMessages = 400;
  int data_loss = 0, ok = 0;
  for (int i = 0; i < kMessages; ++i) {
    const size_t size = 65536 + rng() % 300000;
    const std::vector<uint8_t> payload = Random(size, 500 + i);
    std::vector<uint8_t> got(size, 0);
    Result r;
    PostRecv(receiver, 1000 + i, got.data(), got.size(), &r);
    ASSERT_TRUE(SendAndWait(sender, 1000 + i, payload.data(), payload.size()));
    ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
    if ((i + 1) % 2 == 0) {
      ASSERT_TRUE(absl::IsDataLoss(r.status)) << "message " << i << ": " << r.status;
      EXPECT_TRUE(absl::StartsWith(r.status.message(),
                                   "integrity check failed on link b <- a rail rail0: CRC-32C"))
          << r.status;
      ++data_loss;
    } else {
      ASSERT_TRUE(r.status.ok()) << "message " << i << ": " << r.status;
      ASSERT_EQ(got, payload) << "message " << i;
      ++ok;
    }
  }
  EXPECT_EQ(data_loss, kMessages / 2);
  EXPECT_EQ(ok, kMessages / 2);
  EXPECT_EQ(flipper->flipped(), static_cast<uint64_t>(kMessages / 2));
  EXPECT_EQ(l.rejected.load(), 0);
}

// One foreign message with the tag among a split frame's two, in every order, of every kind: it
// is never accepted. Either it stays unmatched (after the trailer) or the receive fails with
// PERMISSION_DENIED naming the link and why, promptly (no receive waits for a message that will
// not come). The member's two messages are sent on the raw endpoint, byte for byte as
// FramedEndpoint sends them, so that the foreign one can go between them.
TEST(FramedEndpointTest, AForeignMessageAmongASplitFramesTwoIsNeverAccepted) {
  constexpr size_t kSize = 100000;
  enum class Order { kBeforePayload, kBetween, kAfterTrailer };
  struct Case {
    const char* name;
    Order order;
    size_t foreign_size;  // 0: a trailer-like 16 bytes with the magic and a wrong secret
    const char* want;     // in the status message; "" for OK
  };
  const Case cases[] = {
      {"forged trailer first", Order::kBeforePayload, 0,
       "its payload's receive got a 16-byte message"},
      {"short first", Order::kBeforePayload, 10, "its payload's receive got a 10-byte message"},
      {"payload-sized first", Order::kBeforePayload, kSize,
       "its trailer's receive got a message longer than the 16-byte trailer"},
      {"one short of payload first", Order::kBeforePayload, kSize - 1,
       "its payload's receive got a 99999-byte message"},
      {"longer than payload first", Order::kBeforePayload, kSize + 1,
       "its payload's receive got a message longer than the 100000-byte payload"},
      {"forged trailer between", Order::kBetween, 0, "wrong data secret"},
      {"short between", Order::kBetween, 10, "its trailer's receive got a 10-byte message"},
      {"16 zero bytes between", Order::kBetween, 16, "no frame trailer"},
      {"payload-sized between", Order::kBetween, kSize,
       "its trailer's receive got a message longer than the 16-byte trailer"},
      {"forged trailer after", Order::kAfterTrailer, 0, ""},
      {"payload-sized after", Order::kAfterTrailer, kSize, ""},
  };
  for (Integrity integrity : {Integrity::kNone, Integrity::kCrc32c}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(c.name, ", integrity ", IntegrityName(integrity)));
      Link l;
      FramedEndpoint receiver(l.ba_raw, l.SplitOptions(integrity, "b", "a"));
      static constexpr Tag tag = 77;
      std::vector<uint8_t> payload = Random(kSize, 1);
      unsigned char trailer[kFrameTrailerSize];
      const Segment seg{payload.data(), payload.size()};
      WriteFrameTrailer(kSecret, integrity, &seg, 1, trailer, kFrameFlagSplit);
      std::vector<uint8_t> foreign;
      if (c.foreign_size == 0) {
        foreign.resize(kFrameTrailerSize);
        WriteFrameTrailer(kSecret ^ 0x40, integrity, &seg, 1, foreign.data(), kFrameFlagSplit);
      } else if (c.foreign_size == 16) {
        foreign.assign(16, 0);
      } else {
        foreign = Random(c.foreign_size, 99);
      }
      std::vector<uint8_t> got(kSize, 0);
      Result r;
      PostRecv(receiver, tag, got.data(), got.size(), &r);
      // An in-process send completes once matched and copied, so waiting for one fixes the
      // order. A message that may find no receive left (the trailer when its slot took the
      // payload, a foreign message after the trailer) is sent without waiting; it stays
      // unmatched until the fabric goes down with l.
      auto send_unwaited = [&l](const void* data, size_t size) {
        auto done = std::make_shared<Result>();
        l.spoofer->Send(tag, data, size, [done](absl::Status s) { done->status = std::move(s); });
      };
      if (c.order == Order::kBeforePayload) {
        ASSERT_TRUE(SendAndWait(*l.spoofer, tag, foreign.data(), foreign.size()));
      }
      ASSERT_TRUE(SendAndWait(*l.ab_raw, tag, payload.data(), payload.size()));
      if (c.order == Order::kBetween) {
        ASSERT_TRUE(SendAndWait(*l.spoofer, tag, foreign.data(), foreign.size()));
      }
      if (c.order == Order::kAfterTrailer) {
        ASSERT_TRUE(SendAndWait(*l.ab_raw, tag, trailer, kFrameTrailerSize));
        send_unwaited(foreign.data(), foreign.size());
      } else {
        auto done = std::make_shared<Result>();
        l.ab_raw->Send(tag, trailer, kFrameTrailerSize,
                       [done](absl::Status s) { done->status = std::move(s); });
      }
      ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait)) << "the receive never completed";
      if (*c.want == '\0') {
        EXPECT_TRUE(r.status.ok()) << r.status;
        EXPECT_EQ(got, payload);
        EXPECT_EQ(l.rejected.load(), 0);
      } else {
        EXPECT_TRUE(absl::IsPermissionDenied(r.status)) << r.status;
        EXPECT_TRUE(absl::StrContains(r.status.message(), "on link b <- a rail rail0")) << r.status;
        EXPECT_TRUE(absl::StrContains(r.status.message(), c.want)) << r.status;
        EXPECT_EQ(l.rejected.load(), 1);
      }
      EXPECT_EQ(l.integrity_errors.load(), 0);
      // The fabric goes down with l, failing whatever is still pending (a leftover trailer).
    }
  }
}

// A frame sent whole (a sender with splitting off) to a receiver that splits fails promptly
// instead of waiting forever: its payload's receive is too short for it.
TEST(FramedEndpointTest, AOneMessageFrameWhereASplitOneBelongsFailsPromptly) {
  Link l;
  FramedEndpoint::Options whole = l.Options(Integrity::kNone, "a", "b");
  whole.split_min_bytes = 0;
  FramedEndpoint sender(l.ab_raw, std::move(whole));
  FramedEndpoint receiver(l.ba_raw, l.SplitOptions(Integrity::kNone, "b", "a"));
  const std::vector<uint8_t> payload = Random(200000, 5);
  std::vector<uint8_t> got(payload.size());
  Result r;
  PostRecv(receiver, 5, got.data(), got.size(), &r);
  ASSERT_TRUE(SendAndWait(sender, 5, payload.data(), payload.size()));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(absl::IsPermissionDenied(r.status)) << r.status;
  EXPECT_TRUE(absl::StrContains(r.status.message(), "longer than the 200000-byte payload"))
      << r.status;
}

// A one-message frame's trailer never ends a split frame and a split frame's never ends a
// one-message frame, even with the secret (flag split).
TEST(FramedEndpointTest, SplitAndWholeTrailersAreNotInterchangeable) {
  Link l;
  FramedEndpoint receiver(l.ba_raw, l.SplitOptions(Integrity::kNone, "b", "a"));
  // A 0-byte receive: a split frame's 16-byte trailer alone has its exact length.
  Result r;
  PostRecv(receiver, 6, nullptr, 0, &r);
  unsigned char t[kFrameTrailerSize];
  WriteFrameTrailer(kSecret, Integrity::kNone, nullptr, 0, t, kFrameFlagSplit);
  ASSERT_TRUE(SendAndWait(*l.ab_raw, 6, t, sizeof(t)));
  EXPECT_TRUE(l.WaitRejected(1));
  EXPECT_TRUE(absl::StrContains(l.LastRejection(), "a separate trailer")) << l.LastRejection();
  EXPECT_FALSE(r.done.HasBeenNotified());
  WriteFrameTrailer(kSecret, Integrity::kNone, nullptr, 0, t);
  ASSERT_TRUE(SendAndWait(*l.ab_raw, 6, t, sizeof(t)));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(r.status.ok()) << r.status;

  // And the reverse: a split receive whose trailer lacks the flag.
  const std::vector<uint8_t> payload = Random(70000, 8);
  std::vector<uint8_t> got(payload.size());
  Result r2;
  PostRecv(receiver, 7, got.data(), got.size(), &r2);
  ASSERT_TRUE(SendAndWait(*l.ab_raw, 7, payload.data(), payload.size()));
  const Segment seg{const_cast<uint8_t*>(payload.data()), payload.size()};
  WriteFrameTrailer(kSecret, Integrity::kNone, &seg, 1, t);
  ASSERT_TRUE(SendAndWait(*l.ab_raw, 7, t, sizeof(t)));
  ASSERT_TRUE(r2.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(absl::IsPermissionDenied(r2.status)) << r2.status;
  EXPECT_TRUE(absl::StrContains(r2.status.message(), "a one-message frame's trailer")) << r2.status;
}

TEST(FramedEndpointTest, IntegrityNames) {
  EXPECT_EQ(*ParseIntegrity(""), Integrity::kNone);
  EXPECT_EQ(*ParseIntegrity("none"), Integrity::kNone);
  EXPECT_EQ(*ParseIntegrity("crc32c"), Integrity::kCrc32c);
  EXPECT_EQ(ParseIntegrity("md5").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Stronger(Integrity::kNone, Integrity::kCrc32c), Integrity::kCrc32c);
  EXPECT_EQ(IntegrityName(Integrity::kCrc32c), "crc32c");
}

}  // namespace
}  // namespace railyard::transport
