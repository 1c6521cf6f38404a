// ClientListener with real gRPC servers on a real unix socket: a uid's share, the refusal
// server's answer, and that a flood of refused connections never leaves the latest caller with a
// bare broken pipe (the oldest refusal is cut instead).
#include "daemon/services/client_listener.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/server_callback.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

// The "real" server: every call OK.
class OkService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Ok final : public grpc::ServerGenericBidiReactor {
     public:
      Ok() { Finish(grpc::Status::OK); }
      void OnDone() override { delete this; }
    };
    return new Ok();
  }
};

class ClientListenerTest : public ::testing::Test {
 protected:
  void Start(ClientListener::Options options) {
    dir_ = ::testing::TempDir() + "ry-listener-" + std::to_string(::getpid());
    ::mkdir(dir_.c_str(), 0700);
    options.path = dir_ + "/s";
    path_ = options.path;
    auto listener = ClientListener::Bind(options);
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(&ok_);
    server_ = builder.BuildAndStart();
    refusals_ = std::make_unique<RefusalServer>(listener_.get());
    listener_->Start(server_.get(), refusals_->server());
  }
  void TearDown() override {
    for (int fd : raw_) ::close(fd);
    if (listener_ != nullptr) listener_->Stop();
    refusals_.reset();
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now());
      server_->Wait();
    }
    ::rmdir(dir_.c_str());
  }
  // A plain connection that never speaks, kept open.
  int Raw() {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    raw_.push_back(fd);
    return fd;
  }
  // One unary call on a fresh channel.
  grpc::Status Call() {
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);  // a fresh connection, not a shared one
    auto channel =
        grpc::CreateCustomChannel("unix:" + path_, grpc::InsecureChannelCredentials(), args);
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Slice empty("", 0);
    grpc::ByteBuffer request(&empty, 1), response;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&ctx, "/railyard.test/Call", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    done.WaitForNotification();
    return status;
  }
  // Waits (bounded) until the listener has taken every queued connection.
  void Settle(size_t open_plus_refusing) {
    for (int i = 0; i < 200; ++i) {
      const ClientListener::Counts c = listener_->counts();
      if (c.open + c.refusing + c.refusals_cut >= open_plus_refusing) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  // Waits (bounded) until gRPC has closed all but `n` admitted connections: a channel's
  // connection outlives the call that made it by however long the server takes to see EOF.
  void WaitOpen(size_t n) {
    for (int i = 0; i < 200 && listener_->counts().open != n; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  std::string dir_, path_;
  OkService ok_;
  std::unique_ptr<ClientListener> listener_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<RefusalServer> refusals_;
  std::vector<int> raw_;
};

TEST_F(ClientListenerTest, AUidOverItsShareHearsWhyAndItsShareComesBackWhenItCloses) {
  ClientListener::Options o;
  o.max_per_uid = 3;
  Start(o);
  EXPECT_TRUE(Call().ok());
  WaitOpen(0);  // else that call's connection may still hold a third of the share
  ASSERT_EQ(listener_->counts().open, 0u);
  const int a = Raw(), b = Raw(), c = Raw();
  Settle(3);
  EXPECT_EQ(listener_->counts().open, 3u);
  const grpc::Status refused = Call();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_client_connections_per_uid"));
  EXPECT_THAT(refused.error_message(), HasSubstr(absl::StrCat("uid ", ::getuid())));
  EXPECT_GE(listener_->counts().refused_share, 1u);
  for (int fd : {a, b, c}) ::shutdown(fd, SHUT_RDWR);
  // gRPC closes them; the sweep gives the share back.
  grpc::Status again;
  for (int i = 0; i < 100 && !(again = Call()).ok(); ++i) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(again.ok()) << again.error_message();
}

TEST_F(ClientListenerTest, TheLatestRefusedCallerHearsWhyWhateverTheFloodBeforeIt) {
  ClientListener::Options o;
  o.max_per_uid = 2;
  o.max_refusing = 4;
  Start(o);
  for (int i = 0; i < 2 + 40; ++i) Raw();  // 2 admitted, 40 refused and held open
  Settle(42);
  const ClientListener::Counts held = listener_->counts();
  EXPECT_EQ(held.open, 2u);
  EXPECT_LE(held.refusing, 4u);
  EXPECT_GE(held.refusals_cut, 36u);
  const grpc::Status refused = Call();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_client_connections_per_uid"));
  EXPECT_LE(listener_->counts().refusing, 4u);
}

TEST_F(ClientListenerTest, ThePoolLimitIsNamedWhenEveryUidIsUnderItsShare) {
  ClientListener::Options o;
  o.max_connections = 2;
  o.max_per_uid = 0;  // no share: only the pool
  Start(o);
  Raw();
  Raw();
  Settle(2);
  const grpc::Status refused = Call();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_client_connections)"));
  EXPECT_GE(listener_->counts().refused_pool, 1u);
}

TEST(ClientListenerBindTest, AnUnusablePathIsRefusedNamingIt) {
  ClientListener::Options o;
  o.path = "/nonexistent-dir-for-railyard/s";
  auto listener = ClientListener::Bind(o);
  ASSERT_FALSE(listener.ok());
  EXPECT_THAT(std::string(listener.status().message()), HasSubstr(o.path));
  o.path = std::string(200, 'x');
  EXPECT_EQ(ClientListener::Bind(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace railyard
