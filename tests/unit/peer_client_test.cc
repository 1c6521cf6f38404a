// PeerClients: no call without credentials, and a channel cache that stays bounded however many
// coordinators local clients name, without cutting off calls in flight on a dropped channel.
#include "daemon/comm/peer_client.h"

#include <atomic>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

TEST(PeerClientsTest, CallsBeforeCredentialsFailWithFailedPrecondition) {
  PeerClients peers;
  absl::Notification done;
  absl::Status got;
  peers.Heartbeat("127.0.0.1:1", "node-a", "me", absl::Seconds(1), [&](const absl::Status& s) {
    got = s;
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(got.code(), absl::StatusCode::kFailedPrecondition) << got;
  EXPECT_EQ(peers.cached_channels(), 0u);
}

TEST(PeerClientsTest, TheChannelCacheIsBoundedAndEveryCallStillFinishes) {
  PeerClients peers;
  peers.SetInsecure();
  const int calls = static_cast<int>(PeerClients::kMaxChannels) + 100;
  std::atomic<int> finished{0};
  std::atomic<int> ok{0};
  absl::Notification all;
  for (int i = 0; i < calls; ++i) {
    // Distinct targets nobody serves (port 1 on loopback addresses): each call fails fast or at
    // its deadline, after its channel may already have been dropped from the cache.
    const std::string address =
        "127.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1) + ":1";
    peers.Heartbeat(address, "node", "me", absl::Milliseconds(300), [&](const absl::Status& s) {
      if (s.ok()) ok.fetch_add(1);
      if (finished.fetch_add(1) + 1 == calls) all.Notify();
    });
  }
  EXPECT_EQ(peers.cached_channels(), PeerClients::kMaxChannels);
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(60)))
      << finished.load() << " of " << calls << " calls finished";
  EXPECT_EQ(ok.load(), 0);
}

}  // namespace
}  // namespace railyard
