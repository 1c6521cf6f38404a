// Fuzz target: the buffer side channel as a hostile client drives it (daemon/session/fd_channel.h,
// proto/railyard/v1/fd_channel.h), through a real FdChannelServer and a real SOCK_SEQPACKET
// connection. The input is a list of packets, each `<length byte> <descriptor count byte>
// <length bytes>`, sent in order with 0-3 memfds attached (SCM_RIGHTS). Properties: the first
// message is a HELLO with a 32-character ticket; every reply decodes; a packet that decodes as a
// PUT with exactly one descriptor gets PUT_OK with its cookie (or RESOURCE_EXHAUSTED past the
// pending limit); one with another count gets an INVALID_ARGUMENT ERROR and the connection
// stays; anything else gets an ERROR and then end of stream (an empty record reads as end of
// stream: the daemon hangs up without a word); after the client hangs up the
// server lets go of the connection and of every descriptor it received (the process's open
// descriptor count returns to where it was). Also: whatever Decode accepts encodes back to the
// same bytes.
#include <dirent.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "daemon/session/fd_channel.h"
#include "daemon/util/log.h"
#include "proto/railyard/v1/fd_channel.h"
#include "tests/fuzz/fuzz_check.h"

namespace railyard {
namespace {

int OpenFds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n;
}

struct World {
  std::string path;
  std::unique_ptr<FdChannelServer> server;
  int memfds[3];
};

World& TheWorld() {
  static World* const w = [] {
    SetLogLevel(LogLevel::kError);
    auto* world = new World;
    char tmpl[] = "/tmp/ry-fdfuzz-XXXXXX";
    world->path = std::string(::mkdtemp(tmpl)) + "/s.fd";
    FdChannelServer::Options o;
    o.path = world->path;
    auto s = FdChannelServer::Start(o);
    FUZZ_CHECK(s.ok(), s.status().ToString());
    world->server = *std::move(s);
    for (int& fd : world->memfds) fd = ::memfd_create("railyard.fuzz", MFD_CLOEXEC);
    return world;
  }();
  return *w;
}

// The next message, or nullopt at end of stream. A second of silence is a failure.
std::optional<fdproto::Message> Receive(int sock, bool* eof) {
  char data[fdproto::kMaxMessage + 1];
  // libFuzzer's alarm timer interrupts a recv that has SO_RCVTIMEO (never restarted): retry.
  ssize_t n;
  do n = ::recv(sock, data, sizeof(data), 0);
  while (n < 0 && errno == EINTR);
  *eof = n == 0;
  FUZZ_CHECK(n >= 0, absl::StrCat("no answer within 1 s: ", std::strerror(errno)));
  if (n == 0) return std::nullopt;
  std::string why;
  auto m = fdproto::Decode(std::string_view(data, static_cast<size_t>(n)), &why);
  FUZZ_CHECK(m.has_value(), absl::StrCat("the daemon sent a malformed message: ", why));
  return m;
}

void Send(int sock, const std::string& bytes, int nfds) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 3)] = {};
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), TheWorld().memfds, sizeof(int) * nfds);
  }
  ::sendmsg(sock, &msg, MSG_NOSIGNAL);
}

}  // namespace
}  // namespace railyard

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace railyard;
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  if (auto m = fdproto::Decode(all, nullptr)) {
    FUZZ_CHECK(fdproto::Encode(*m) == all, "Decode accepted bytes Encode does not give back");
  }
  World& w = TheWorld();
  // Per input: libFuzzer's symbolizer keeps two pipes open once it first prints a NEW_FUNC.
  const int baseline = OpenFds();
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, w.path.c_str(), sizeof(addr.sun_path) - 1);
  FUZZ_CHECK(::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0,
             std::strerror(errno));
  timeval tv{1, 0};
  ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  bool eof = false;
  auto hello = Receive(sock.get(), &eof);
  FUZZ_CHECK(hello.has_value() && hello->type == fdproto::Type::kHello &&
                 hello->payload.size() == fdproto::kTicketChars,
             "the first message is not a HELLO with a ticket");
  size_t pos = 0;
  for (int packets = 0; pos + 2 <= size && packets < 32; ++packets) {
    const size_t len = std::min<size_t>(data[pos], size - pos - 2);
    const int nfds = data[pos + 1] % 4;
    const std::string bytes(reinterpret_cast<const char*>(data + pos + 2), len);
    pos += 2 + len;
    Send(sock.get(), bytes, nfds);
    if (bytes.empty()) {
      // A SOCK_SEQPACKET record of 0 bytes reads as end of stream: the daemon hangs up.
      FUZZ_CHECK(!Receive(sock.get(), &eof).has_value() && eof,
                 "an empty record did not end the connection");
      break;
    }
    auto sent = fdproto::Decode(bytes, nullptr);
    auto reply = Receive(sock.get(), &eof);
    FUZZ_CHECK(reply.has_value(), "the daemon hung up without an ERROR saying why");
    if (!sent.has_value() || sent->type != fdproto::Type::kPut) {
      FUZZ_CHECK(reply->type == fdproto::Type::kError, "a malformed message got no ERROR");
      Receive(sock.get(), &eof);
      FUZZ_CHECK(eof, "the connection stayed open after a malformed message");
      break;
    }
    FUZZ_CHECK(reply->cookie == sent->cookie, "a reply to another cookie");
    if (nfds == 1) {
      FUZZ_CHECK(reply->type == fdproto::Type::kPutOk ||
                     (reply->type == fdproto::Type::kError &&
                      reply->code == static_cast<uint32_t>(absl::StatusCode::kResourceExhausted)),
                 "a PUT with one descriptor was neither accepted nor over the limit");
    } else {
      FUZZ_CHECK(reply->type == fdproto::Type::kError &&
                     reply->code == static_cast<uint32_t>(absl::StatusCode::kInvalidArgument),
                 absl::StrCat("a PUT with ", nfds, " descriptors was not refused"));
    }
  }
  sock.Reset();
  // The server drops the connection and closes what it received (bounded wait).
  for (int i = 0; i < 20000 && (w.server->connections() > 0 || OpenFds() > baseline); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(i < 100 ? 20 : 200));
  }
  FUZZ_CHECK(w.server->connections() == 0, "the server kept a closed connection");
  FUZZ_CHECK(OpenFds() <= baseline,
             absl::StrCat("descriptors leaked: ", OpenFds(), " open, ", baseline, " before"));
  return 0;
}
