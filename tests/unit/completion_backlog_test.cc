// The completion backlog quota (Resource::kCompletionBytes): a session's Connect stream charges
// each queued completion's serialized size until it is written or dropped, completions past the
// limit are still queued (never lost), and SubmitPath::Submit refuses new work while the backlog
// is at or over the limit. The stream is never bound to a gRPC call here: its writes wait until
// the test reports them done (OnWriteDone), like a client that stops reading.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/core/daemon_core.h"
#include "daemon/session/fd_channel.h"
#include "daemon/session/quota.h"
#include "daemon/session/session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/railyard/v1/fd_channel.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

constexpr int kBacklog = static_cast<int>(Resource::kCompletionBytes);

// What Session::PostCompletion queues for this completion, serialized.
uint64_t CompletionBytes(uint64_t request_id, const absl::Status& status, uint64_t seq) {
  return CompletionEvent(request_id, status, seq).ByteSizeLong();
}

TEST(CompletionBacklogTest, QueuedCompletionsHoldTheirBytesUntilWrittenAndAreNeverDropped) {
  QuotaLimits limits;
  limits.per_session[kBacklog] = 64;
  limits.per_job[kBacklog] = 1000;
  auto job = std::make_shared<JobUsage>("j");
  auto quota = std::make_shared<QuotaAccount>(&limits, job);
  Session session("sid", "j", 1, "test", quota);
  auto* stream = new SessionStream(nullptr, nullptr);
  session.AttachStream(stream);

  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (uint64_t id = 1; quota->CheckBelow(Resource::kCompletionBytes).ok(); ++id) {
    ASSERT_LT(id, 100u);
    const absl::Status st = id % 2 == 0 ? absl::OkStatus() : absl::AbortedError("it failed");
    session.PostCompletion(id, st, id);
    sizes.push_back(CompletionBytes(id, st, id));
    total += sizes.back();
    EXPECT_EQ(quota->used(Resource::kCompletionBytes), total);
  }
  EXPECT_GE(total, 64u);
  absl::Status full = quota->CheckBelow(Resource::kCompletionBytes);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(),
              HasSubstr("bytes of completion backlog limit of this session (64) reached"));
  EXPECT_THAT(full.message(), HasSubstr("(--max_completion_backlog_bytes_per_session)"));
  // Past the limit a completion is still queued (it is owed): charged past the limit.
  session.PostCompletion(500, absl::OkStatus(), 7);
  sizes.push_back(CompletionBytes(500, absl::OkStatus(), 7));
  total += sizes.back();
  EXPECT_EQ(quota->used(Resource::kCompletionBytes), total);
  EXPECT_EQ(job->used(Resource::kCompletionBytes), total);
  // Each write done gives its event's bytes back, in order.
  for (uint64_t bytes : sizes) {
    stream->OnWriteDone(true);
    total -= bytes;
    EXPECT_EQ(quota->used(Resource::kCompletionBytes), total);
  }
  EXPECT_EQ(total, 0u);
  EXPECT_TRUE(quota->CheckBelow(Resource::kCompletionBytes).ok());
  // A broken stream drops what it held, and its bytes with it; later events are not queued.
  for (uint64_t id = 600; id < 603; ++id) session.PostCompletion(id, absl::OkStatus(), id);
  EXPECT_GT(quota->used(Resource::kCompletionBytes), 0u);
  stream->OnWriteDone(false);
  EXPECT_EQ(quota->used(Resource::kCompletionBytes), 0u);
  session.PostCompletion(700, absl::OkStatus(), 700);
  EXPECT_EQ(quota->used(Resource::kCompletionBytes), 0u);
  EXPECT_EQ(job->used(Resource::kCompletionBytes), 0u);
  session.DetachStream();
  delete stream;
}

TEST(CompletionBacklogTest, DestroyingAStreamReleasesWhatItStillHeld) {
  QuotaLimits limits;
  limits.per_session[kBacklog] = 16;
  auto quota = std::make_shared<QuotaAccount>(&limits, std::make_shared<JobUsage>("j"));
  auto* stream = new SessionStream(nullptr, nullptr);
  v1::SessionEvent event;
  event.mutable_completion()->set_request_id(9);
  stream->Send(event, quota);
  stream->Send(event, quota);
  stream->Send(event);  // not accounted (the Connected event)
  EXPECT_EQ(quota->used(Resource::kCompletionBytes), 2 * event.ByteSizeLong());
  delete stream;
  EXPECT_EQ(quota->used(Resource::kCompletionBytes), 0u);
}

// The daemon's Submit path, in process: sessions of DaemonCore with one-rank communicators whose
// barriers complete at once, into streams nobody reads.
class DaemonBacklogTest : public ::testing::Test {
 protected:
  struct Rank {
    std::shared_ptr<Session> session;
    SessionStream* stream = nullptr;
    uint64_t handle = 0;
    std::shared_ptr<UniqueFd> side;  // the session's side channel (its ticket named in Connect)
  };

  void SetUp() override {
    char tmpl[] = "/tmp/ry-backlog-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    DaemonConfig config;
    config.node_name = "unit";
    config.state_dir = dir_;
    config.worker_threads = 1;
    config.quotas.per_session[kBacklog] = 200;
    config.quotas.per_job[kBacklog] = 0;
    SessionAuth auth;
    auth.first_session_sets_token = true;
    core_ = std::make_unique<DaemonCore>(config, std::move(auth));
    FdChannelServer::Options fd_options;
    fd_options.path = dir_ + "/s.fd";
    auto fds = FdChannelServer::Start(fd_options);
    ASSERT_TRUE(fds.ok()) << fds.status();
    fds_ = *std::move(fds);
    core_->SetFdChannels(fds_.get());
  }
  // Connects a side channel and returns it with the ticket its HELLO carried.
  std::pair<std::shared_ptr<UniqueFd>, std::string> SideChannel() {
    auto fd = std::make_shared<UniqueFd>(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, (dir_ + "/s.fd").c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::connect(fd->get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    char data[fdproto::kMaxMessage];
    const ssize_t n = ::recv(fd->get(), data, sizeof(data), 0);
    auto hello = fdproto::Decode(std::string_view(data, n > 0 ? n : 0), nullptr);
    EXPECT_TRUE(hello.has_value());
    return {fd, hello.has_value() ? hello->payload : std::string()};
  }
  void TearDown() override {
    for (Rank& r : ranks_) r.session->DetachStream();
    core_->Shutdown();
    fds_->Stop();
    for (Rank& r : ranks_) delete r.stream;
    core_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  Rank& Connect(const std::string& job) {
    v1::ConnectRequest req;
    req.set_job_id(job);
    req.set_token("t");
    req.set_pid(::getpid());
    auto [side, ticket] = SideChannel();
    req.set_fd_ticket(ticket);
    auto s = core_->sessions().Open(req);
    EXPECT_TRUE(s.ok()) << s.status();
    Rank r;
    r.session = *s;
    r.side = side;
    r.stream = new SessionStream(nullptr, nullptr);
    r.session->AttachStream(r.stream);
    v1::InitCommRequest init;
    init.set_session_id(r.session->id());
    init.set_comm_id(core_->joins().NewCommId());
    init.set_rank(0);
    init.set_nranks(1);
    struct Joined {
      absl::Notification done;
      absl::Status status;
      uint64_t handle = 0;
    };
    auto joined = std::make_shared<Joined>();
    EXPECT_TRUE(core_->joins()
                    .InitComm(r.session, init,
                              [joined](const absl::Status& st, uint64_t handle, int, uint64_t) {
                                joined->status = st;
                                joined->handle = handle;
                                joined->done.Notify();
                              })
                    .ok());
    EXPECT_TRUE(joined->done.WaitForNotificationWithTimeout(absl::Seconds(20)));
    EXPECT_TRUE(joined->status.ok()) << joined->status;
    r.handle = joined->handle;
    ranks_.push_back(std::move(r));
    return ranks_.back();
  }

  absl::StatusOr<uint64_t> Barrier(const Rank& r, uint64_t request_id) {
    v1::SubmitRequest req;
    req.set_session_id(r.session->id());
    req.set_comm_handle(r.handle);
    req.set_request_id(request_id);
    req.set_op(v1::COLLECTIVE_OP_BARRIER);
    return core_->submitter().Submit(r.session, req, nullptr);
  }

  std::string dir_;
  std::unique_ptr<DaemonCore> core_;
  std::unique_ptr<FdChannelServer> fds_;
  std::vector<Rank> ranks_;
};

TEST_F(DaemonBacklogTest, SubmitsAreRefusedWhileTheClientDoesNotReadItsCompletions) {
  ranks_.reserve(2);
  Rank& slow = Connect("reads-nothing");
  Rank& other = Connect("reads-fine");
  // Each barrier completes at once; its completion waits in the unread stream.
  uint64_t accepted = 0;
  absl::Status refused;
  for (uint64_t id = 1; id < 200; ++id) {
    absl::StatusOr<uint64_t> seq = Barrier(slow, id);
    if (!seq.ok()) {
      refused = seq.status();
      break;
    }
    EXPECT_EQ(*seq, accepted);
    ++accepted;
  }
  EXPECT_GT(accepted, 1u);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              HasSubstr("submit refused until the client reads its completions: bytes of "
                        "completion backlog limit of this session (200) reached"));
  EXPECT_THAT(refused.message(), HasSubstr("(--max_completion_backlog_bytes_per_session)"));
  const QuotaAccount& q = *slow.session->quota();
  EXPECT_GE(q.used(Resource::kCompletionBytes), 200u);
  // Another session (another job) is not held back.
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(Barrier(other, id).ok());
    other.stream->OnWriteDone(true);
  }
  EXPECT_EQ(other.session->quota()->used(Resource::kCompletionBytes), 0u);
  // Every accepted barrier's completion is still there to be written: once the client reads
  // them, the session submits again, at the next sequence number.
  for (uint64_t i = 0; i < accepted; ++i) slow.stream->OnWriteDone(true);
  EXPECT_EQ(q.used(Resource::kCompletionBytes), 0u);
  absl::StatusOr<uint64_t> again = Barrier(slow, 1000);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, accepted);
}

}  // namespace
}  // namespace railyard
