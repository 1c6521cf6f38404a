// The handover socket (daemon/handover): its framing and descriptors, bad input from the other
// end, version ranges, and both ends of a takeover in one process (the old daemon's
// HandoverServer and the new one's Takeover) with hooks standing in for the daemon.
#include "daemon/handover/handover.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/handover/handover_channel.h"
#include "gtest/gtest.h"

namespace railyard::handover {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/ry-handover-XXXXXX";
  return ::mkdtemp(tmpl);
}

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

// A connected pair (stream sockets, like the handover socket's connections).
void Pair(UniqueFd* a, UniqueFd* b) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  *a = UniqueFd(fds[0]);
  *b = UniqueFd(fds[1]);
}

TEST(HandoverChannelTest, PathSitsBesideTheSocket) {
  EXPECT_EQ(HandoverPath("/run/railyard/railyard.sock"), "/run/railyard/railyard.sock.handover");
}

TEST(HandoverChannelTest, MessageAndDescriptorsGoThrough) {
  UniqueFd a, b;
  Pair(&a, &b);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  v1::HandoverMessage m = Stamped();
  m.mutable_offer()->add_fds("client");
  m.mutable_offer()->set_socket("/x.sock");
  ASSERT_TRUE(Send(a.get(), m, {pipe_fds[1]}, Soon()).ok());
  ::close(pipe_fds[1]);
  absl::StatusOr<Received> got = Receive(b.get(), Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->message.protocol(), kProtocol);
  EXPECT_EQ(got->message.offer().socket(), "/x.sock");
  ASSERT_EQ(got->fds.size(), 1u);
  // The descriptor that came is the pipe's write end: what is written reaches the read end.
  ASSERT_EQ(::write(got->fds[0].get(), "ok", 2), 2);
  char buf[2];
  ASSERT_EQ(::read(pipe_fds[0], buf, 2), 2);
  EXPECT_EQ(std::string(buf, 2), "ok");
  ::close(pipe_fds[0]);
}

TEST(HandoverChannelTest, AnOversizedFrameIsRefused) {
  UniqueFd a, b;
  Pair(&a, &b);
  const uint32_t len = kMaxMessageBytes + 1;
  ASSERT_EQ(::write(a.get(), &len, 4), 4);
  absl::StatusOr<Received> got = Receive(b.get(), Soon());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("at most"), std::string::npos) << got.status();
}

TEST(HandoverChannelTest, GarbageDoesNotParse) {
  UniqueFd a, b;
  Pair(&a, &b);
  // A length of 5, then 5 bytes that are no protobuf message (a field tag with no value).
  const std::string junk("\x05\x00\x00\x00\xff\xff\xff\xff\xff", 9);
  ASSERT_EQ(::write(a.get(), junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  absl::StatusOr<Received> got = Receive(b.get(), Soon());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
}

TEST(HandoverChannelTest, APeerThatClosesOrSaysNothingEndsTheWait) {
  UniqueFd a, b;
  Pair(&a, &b);
  absl::StatusOr<Received> silent = Receive(b.get(), absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(silent.status().code(), absl::StatusCode::kDeadlineExceeded);
  const uint32_t len = 10;
  ASSERT_EQ(::write(a.get(), &len, 4), 4);  // a length, then nothing: the peer goes away
  a.Reset();
  absl::StatusOr<Received> closed = Receive(b.get(), Soon());
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kUnavailable);
}

TEST(HandoverChannelTest, TooManyDescriptorsAreRefused) {
  UniqueFd a, b;
  Pair(&a, &b);
  // Sent raw: Send itself refuses more than kMaxFds.
  std::vector<int> fds(kMaxFds + 1, STDIN_FILENO);
  EXPECT_EQ(Send(a.get(), Stamped(), fds, Soon()).code(), absl::StatusCode::kInvalidArgument);
  std::string payload;
  Stamped().SerializeToString(&payload);
  std::string frame(4, '\0');
  const uint32_t len = payload.size();
  std::memcpy(frame.data(), &len, 4);
  frame += payload;
  iovec iov{frame.data(), frame.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kMaxFds + 1))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  ASSERT_GT(::sendmsg(a.get(), &msg, 0), 0);
  absl::StatusOr<Received> got = Receive(b.get(), Soon());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
}

TEST(HandoverChannelTest, VersionRangesMeetOrSaySo) {
  EXPECT_TRUE(Compatible(kMinProtocol, kProtocol).ok());
  EXPECT_TRUE(Compatible(1, kProtocol + 5).ok());  // a newer daemon that still speaks ours
  absl::Status newer = Compatible(kProtocol + 1, kProtocol + 2);
  EXPECT_EQ(newer.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(newer.message().find("one release at a time"), std::string::npos) << newer;
  EXPECT_FALSE(Compatible(3, 2).ok());  // an empty range
  EXPECT_FALSE(Compatible(0, 0).ok());  // older than the oldest spoken
}

TEST(HandoverChannelTest, TheSocketIsTheOwnersOnly) {
  const std::string dir = TempDir();
  const std::string path = dir + "/r.sock.handover";
  absl::StatusOr<UniqueFd> listen = ListenAt(path);
  ASSERT_TRUE(listen.ok()) << listen.status();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A second listener replaces the first atomically (a newer daemon's).
  absl::StatusOr<UniqueFd> again = ListenAt(path);
  ASSERT_TRUE(again.ok()) << again.status();
  std::filesystem::remove_all(dir);
}

// Both ends in this process: the hooks record what the daemon would do.
class TakeoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    socket_ = dir_ + "/r.sock";
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, offered_), 0);
    HandoverServer::Hooks hooks;
    hooks.offer = [this] {
      return std::vector<std::pair<std::string, int>>{{kClientSocket, offered_[0]}};
    };
    hooks.release = [this] {
      released_.store(true);
      return 3u;
    };
    hooks.hand_over = [this] { handed_over_.Notify(); };
    absl::StatusOr<std::unique_ptr<HandoverServer>> server =
        HandoverServer::Start(HandoverPath(socket_), socket_, absl::Seconds(2), std::move(hooks));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    server_.reset();
    ::close(offered_[0]);
    ::close(offered_[1]);
    std::filesystem::remove_all(dir_);
  }

  std::string dir_;
  std::string socket_;
  int offered_[2] = {-1, -1};
  std::atomic<bool> released_{false};
  absl::Notification handed_over_;
  std::unique_ptr<HandoverServer> server_;
};

TEST_F(TakeoverTest, TheNewDaemonGetsTheSocketsAndTheOldOneHandsOver) {
  absl::StatusOr<Takeover> t = Takeover::Begin(socket_, absl::Seconds(5));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->old_pid(), ::getpid());
  EXPECT_EQ(t->old_protocol(), kProtocol);
  UniqueFd client = t->Take(kClientSocket);
  ASSERT_TRUE(client.valid());
  EXPECT_FALSE(t->Take(kSideChannel).valid());  // not offered
  // The descriptor is the offered socket itself: bytes written to it reach its peer.
  ASSERT_EQ(::write(client.get(), "x", 1), 1);
  char c = 0;
  ASSERT_EQ(::read(offered_[1], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  EXPECT_FALSE(released_.load());  // nothing changes before Ready
  absl::StatusOr<uint32_t> sessions = t->Ready(absl::Seconds(5));
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  EXPECT_EQ(*sessions, 3u);
  EXPECT_TRUE(released_.load());
  EXPECT_TRUE(handed_over_.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(server_->handed_over());
}

TEST_F(TakeoverTest, ANewDaemonThatGoesAwayBeforeReadyChangesNothing) {
  {
    absl::StatusOr<Takeover> t = Takeover::Begin(socket_, absl::Seconds(5));
    ASSERT_TRUE(t.ok()) << t.status();
  }  // closed without Ready: a new daemon that failed to start
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(released_.load());
  EXPECT_FALSE(server_->handed_over());
  // The old daemon still serves takeovers.
  absl::StatusOr<Takeover> again = Takeover::Begin(socket_, absl::Seconds(5));
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(again->Ready(absl::Seconds(5)).ok());
  EXPECT_TRUE(released_.load());
}

TEST_F(TakeoverTest, AnotherSocketIsRefused) {
  absl::StatusOr<Takeover> t = Takeover::Begin(dir_ + "/other.sock", absl::Milliseconds(200));
  // Nobody serves other.sock.handover.
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable) << t.status();
  EXPECT_NE(t.status().message().find("no railyardd to take over from"), std::string::npos);
}

TEST_F(TakeoverTest, AnIncompatibleVersionIsRefusedWithWhy) {
  absl::StatusOr<UniqueFd> conn = ConnectTo(HandoverPath(socket_), absl::Seconds(2));
  ASSERT_TRUE(conn.ok()) << conn.status();
  v1::HandoverMessage hello = Stamped();
  hello.set_protocol(kProtocol + 7);
  hello.mutable_hello()->set_min_protocol(kProtocol + 5);
  ASSERT_TRUE(Send(conn->get(), hello, {}, Soon()).ok());
  absl::StatusOr<Received> answer = Receive(conn->get(), Soon());
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_TRUE(answer->message.has_refused());
  EXPECT_NE(answer->message.refused().reason().find("do not meet"), std::string::npos)
      << answer->message.refused().reason();
  EXPECT_TRUE(answer->fds.empty());
  EXPECT_FALSE(released_.load());
}

TEST_F(TakeoverTest, AMessageOtherThanHelloIsRefused) {
  absl::StatusOr<UniqueFd> conn = ConnectTo(HandoverPath(socket_), absl::Seconds(2));
  ASSERT_TRUE(conn.ok()) << conn.status();
  v1::HandoverMessage ready = Stamped();
  ready.mutable_ready();  // Ready without a Hello and an Offer: no descriptors, no release
  ASSERT_TRUE(Send(conn->get(), ready, {}, Soon()).ok());
  absl::StatusOr<Received> answer = Receive(conn->get(), Soon());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->message.has_refused());
  EXPECT_TRUE(answer->fds.empty());
  EXPECT_FALSE(released_.load());
}

}  // namespace
}  // namespace railyard::handover
