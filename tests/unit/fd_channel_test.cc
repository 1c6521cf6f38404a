// FdChannelServer with real sockets in a temp directory: the HELLO ticket and its one-time
// Claim with the kernel's peer credentials, PUT/handle/Take, the limits (pending descriptors,
// unbound connections), the unbound timeout, descriptors of refused messages closed, a session's
// Close ending the connection, Stop removing the socket.
#include "daemon/session/fd_channel.h"

#include <dirent.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/railyard/v1/fd_channel.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

int OpenFds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n;
}

class FdChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ry-fdchan-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    options_.path = dir_ + "/s.fd";
    options_.max_unbound = 2;
    options_.max_pending_fds = 2;
    options_.max_connections = 3;
    options_.bind_timeout = absl::Seconds(1);
  }
  void TearDown() override {
    server_.reset();
    ::rmdir(dir_.c_str());
  }
  void Start() {
    auto s = FdChannelServer::Start(options_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  // A connected client socket (5 s receive timeout).
  UniqueFd Connect() {
    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, options_.path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{5, 0};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }
  // The next message, or nullopt at EOF / timeout.
  std::optional<fdproto::Message> Receive(const UniqueFd& fd) {
    char data[fdproto::kMaxMessage];
    const ssize_t n = ::recv(fd.get(), data, sizeof(data), 0);
    if (n <= 0) return std::nullopt;
    return fdproto::Decode(std::string_view(data, static_cast<size_t>(n)), nullptr);
  }
  void Send(const UniqueFd& sock, const std::string& bytes, const std::vector<int>& fds) {
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    if (!fds.empty()) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    ASSERT_EQ(::sendmsg(sock.get(), &msg, MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  std::optional<fdproto::Message> Put(const UniqueFd& sock, std::vector<int> fds,
                                      uint64_t cookie = 9) {
    fdproto::Message m;
    m.type = fdproto::Type::kPut;
    m.cookie = cookie;
    Send(sock, fdproto::Encode(m), fds);
    return Receive(sock);
  }
  static UniqueFd Memfd() {
    UniqueFd fd(::memfd_create("railyard.fdtest", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_EQ(::ftruncate(fd.get(), 4096), 0);
    return fd;
  }

  std::string dir_;
  FdChannelServer::Options options_;
  std::unique_ptr<FdChannelServer> server_;
};

TEST_F(FdChannelTest, TheTicketBindsOnceWithTheKernelsCredentialsAndHandlesAreOneTime) {
  Start();
  struct stat st {};
  ASSERT_EQ(::stat(options_.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  UniqueFd c = Connect();
  auto hello = Receive(c);
  ASSERT_TRUE(hello.has_value());
  ASSERT_EQ(hello->type, fdproto::Type::kHello);
  ASSERT_EQ(hello->payload.size(), fdproto::kTicketChars);
  auto channel = server_->Claim(hello->payload);
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_EQ((*channel)->cred().pid, ::getpid());
  EXPECT_EQ((*channel)->cred().uid, ::getuid());
  EXPECT_EQ((*channel)->cred().gid, ::getgid());
  EXPECT_EQ(server_->Claim(hello->payload).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(server_->Claim("0123456789abcdef0123456789abcdef").status().code(),
            absl::StatusCode::kNotFound);

  UniqueFd mem = Memfd();
  auto ok = Put(c, {mem.get()}, 77);
  ASSERT_TRUE(ok.has_value());
  ASSERT_EQ(ok->type, fdproto::Type::kPutOk);
  EXPECT_EQ(ok->cookie, 77u);
  absl::StatusOr<UniqueFd> taken = (*channel)->Take(ok->handle);
  ASSERT_TRUE(taken.ok()) << taken.status();
  struct stat a {
  }, b{};
  ASSERT_EQ(::fstat(mem.get(), &a), 0);
  ASSERT_EQ(::fstat(taken->get(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);  // the same memfd arrived
  EXPECT_EQ((*channel)->Take(ok->handle).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*channel)->Take(ok->handle + 1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(FdChannelTest, PendingDescriptorsAreBoundedAndRefusedMessagesCloseWhatTheyCarried) {
  Start();
  UniqueFd c = Connect();
  ASSERT_TRUE(Receive(c).has_value());
  const int baseline = OpenFds();
  UniqueFd m1 = Memfd(), m2 = Memfd(), m3 = Memfd();
  auto too_many = Put(c, {m1.get(), m2.get(), m3.get()});
  ASSERT_TRUE(too_many.has_value());
  EXPECT_EQ(too_many->type, fdproto::Type::kError);
  EXPECT_EQ(too_many->code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(too_many->payload, HasSubstr("exactly one descriptor"));
  auto none = Put(c, {});
  ASSERT_TRUE(none.has_value());
  EXPECT_THAT(none->payload, HasSubstr("had none"));
  // The server's copies of the three are closed: only our own three are open beyond baseline.
  EXPECT_EQ(OpenFds(), baseline + 3);
  EXPECT_EQ(Put(c, {m1.get()})->type, fdproto::Type::kPutOk);
  EXPECT_EQ(Put(c, {m2.get()})->type, fdproto::Type::kPutOk);
  auto full = Put(c, {m3.get()});
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->type, fdproto::Type::kError);
  EXPECT_EQ(full->code, static_cast<uint32_t>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(full->payload, HasSubstr("not yet registered"));
  EXPECT_EQ(OpenFds(), baseline + 3 + 2);  // the two pending ones, held by the server
}

TEST_F(FdChannelTest, AnEmptyRecordEndsTheConnectionAndTheDescriptorItCarriedIsClosed) {
  Start();
  UniqueFd c = Connect();
  ASSERT_TRUE(Receive(c).has_value());
  const int baseline = OpenFds();
  {
    UniqueFd mem = Memfd();
    Send(c, "", {mem.get()});  // reads as end of stream (found by fd_channel_fuzz: it leaked)
  }
  EXPECT_FALSE(Receive(c).has_value());
  c.Reset();
  for (int i = 0; i < 200 && (server_->connections() > 0 || OpenFds() > baseline - 2); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server_->connections(), 0u);
  // Gone: both ends of the connection, and both copies of the memfd.
  EXPECT_EQ(OpenFds(), baseline - 2);
}

TEST_F(FdChannelTest, MalformedMessagesEndTheConnection) {
  Start();
  fdproto::Message wrong_way;
  wrong_way.type = fdproto::Type::kPutOk;  // only the daemon sends these
  for (const std::string& bad :
       {std::string("hello"), std::string(40, 'x'), fdproto::Encode(wrong_way)}) {
    UniqueFd c = Connect();
    ASSERT_TRUE(Receive(c).has_value());
    Send(c, bad, {});
    auto error = Receive(c);
    ASSERT_TRUE(error.has_value());
    EXPECT_EQ(error->type, fdproto::Type::kError);
    EXPECT_THAT(error->payload, HasSubstr("malformed fd channel message"));
    EXPECT_FALSE(Receive(c).has_value());  // EOF
  }
}

TEST_F(FdChannelTest, UnboundConnectionsAreBoundedAndTimedOut) {
  Start();
  UniqueFd a = Connect(), b = Connect(), c = Connect();
  ASSERT_EQ(Receive(a)->type, fdproto::Type::kHello);
  ASSERT_EQ(Receive(b)->type, fdproto::Type::kHello);
  auto refused = Receive(c);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->type, fdproto::Type::kError);
  EXPECT_EQ(refused->code, static_cast<uint32_t>(absl::StatusCode::kResourceExhausted));
  // Nobody claims a or b: after bind_timeout (1 s; swept every second) they are dropped.
  const auto start = std::chrono::steady_clock::now();
  auto expired = Receive(a);
  ASSERT_TRUE(expired.has_value());
  EXPECT_EQ(expired->code, static_cast<uint32_t>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_FALSE(Receive(a).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  // Room again.
  UniqueFd d = Connect();
  EXPECT_EQ(Receive(d)->type, fdproto::Type::kHello);
}

// Connects as `uid` from a child process (root only) and returns the type of the first message
// it got (kHello or kError), or -1. The child only makes system calls: safe after fork() here.
int FirstMessageTypeAs(const std::string& path, uid_t uid) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    char type = -1;
    if (::setgid(0) == 0 && ::setuid(uid) == 0) {
      const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
      timeval tv{5, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      char data[fdproto::kMaxMessage];
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
          ::recv(fd, data, sizeof(data), 0) >= 8) {
        type =
            static_cast<char>(fdproto::detail::Get(reinterpret_cast<unsigned char*>(data) + 6, 2));
      }
    }
    (void)!::write(pipe_fds[1], &type, 1);
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  char type = -1;
  (void)!::read(pipe_fds[0], &type, 1);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return type;
}

// One process without a token that keeps connections unbound holds its uid's share, not the
// pool: another uid still gets its HELLO (issue 55: 64 such connections refused every job).
TEST_F(FdChannelTest, OneUidsUnboundConnectionsStopAtItsShareAndOtherUidsAreServed) {
  options_.max_unbound = 10;
  options_.max_unbound_per_uid = 2;
  options_.max_connections = 20;
  options_.bind_timeout = absl::Seconds(30);
  Start();
  UniqueFd a = Connect(), b = Connect(), c = Connect();
  auto hello_a = Receive(a);
  ASSERT_EQ(hello_a->type, fdproto::Type::kHello);
  ASSERT_EQ(Receive(b)->type, fdproto::Type::kHello);
  auto refused = Receive(c);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->type, fdproto::Type::kError);
  EXPECT_EQ(refused->code, static_cast<uint32_t>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(refused->payload,
              HasSubstr(absl::StrCat("uid ", ::getuid(), " has 2 side-channel connections")));
  EXPECT_THAT(refused->payload, HasSubstr("(--max_unbound_side_channels_per_uid)"));
  if (::getuid() == 0) {
    ::chmod(dir_.c_str(), 0755);
    ::chmod(options_.path.c_str(), 0666);
    EXPECT_EQ(FirstMessageTypeAs(options_.path, 65534), static_cast<int>(fdproto::Type::kHello));
  }
  // Binding one (a Connect claims its ticket) gives its share back.
  ASSERT_TRUE(server_->Claim(hello_a->payload).ok());
  UniqueFd d = Connect();
  EXPECT_EQ(Receive(d)->type, fdproto::Type::kHello);
}

TEST_F(FdChannelTest, ClosingTheSessionsChannelEndsItAndStopRemovesTheSocket) {
  Start();
  UniqueFd c = Connect();
  auto hello = Receive(c);
  auto channel = server_->Claim(hello->payload);
  ASSERT_TRUE(channel.ok());
  UniqueFd mem = Memfd();
  auto ok = Put(c, {mem.get()});
  (*channel)->Close();
  EXPECT_FALSE(Receive(c).has_value());  // EOF
  for (int i = 0; i < 100 && server_->connections() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->connections(), 0u);
  EXPECT_EQ((*channel)->Take(ok->handle).status().code(), absl::StatusCode::kFailedPrecondition);
  server_->Stop();
  EXPECT_NE(::access(options_.path.c_str(), F_OK), 0);
}

TEST(FdProtocolTest, EncodeDecodeRoundTripsAndDecodeRefusesWhatIsWrong) {
  fdproto::Message m;
  m.type = fdproto::Type::kError;
  m.cookie = 0x0102030405060708;
  m.handle = ~uint64_t{0};
  m.code = 8;
  m.payload = "why";
  const std::string bytes = fdproto::Encode(m);
  ASSERT_EQ(bytes.size(), fdproto::kHeaderBytes + 3);
  EXPECT_EQ(bytes.substr(0, 4), "RYFD");
  auto back = fdproto::Decode(bytes, nullptr);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->cookie, m.cookie);
  EXPECT_EQ(back->handle, m.handle);
  EXPECT_EQ(back->payload, "why");
  std::string why;
  EXPECT_FALSE(fdproto::Decode(bytes.substr(0, 31), &why).has_value());
  EXPECT_THAT(why, HasSubstr("shorter"));
  std::string wrong_len = bytes + "x";
  EXPECT_FALSE(fdproto::Decode(wrong_len, &why).has_value());
  EXPECT_THAT(why, HasSubstr("length"));
  std::string bad_type = bytes;
  bad_type[6] = 9;
  EXPECT_FALSE(fdproto::Decode(bad_type, &why).has_value());
  std::string bad_version = bytes;
  bad_version[4] = 2;
  EXPECT_FALSE(fdproto::Decode(bad_version, &why).has_value());
  m.payload = std::string(1000, 'p');  // cut to the limit
  EXPECT_EQ(fdproto::Encode(m).size(), fdproto::kMaxMessage);
}

}  // namespace
}  // namespace railyard
