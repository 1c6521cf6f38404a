// Bad input against a real railyardd: each answer is a gRPC status with a message that says what
// and why, nothing leaks, and the daemon keeps serving.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace railyard::testing {
namespace {

using ::testing::HasSubstr;

// Raw access to the Local service, for requests the client library would never send.
class RawLocal {
 public:
  explicit RawLocal(const DaemonProcess& d) : stub_(v1::Local::NewStub(d.Channel())) {}

  grpc::Status Submit(const v1::SubmitRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitResponse resp;
    return stub_->Submit(&ctx, req, &resp);
  }
  grpc::Status Register(const std::string& session, uint64_t fd_handle, uint64_t size) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RegisterBufferRequest req;
    req.set_session_id(session);
    req.set_fd_handle(fd_handle);
    req.set_size_bytes(size);
    v1::RegisterBufferResponse resp;
    return stub_->RegisterBuffer(&ctx, req, &resp);
  }
  grpc::Status Init(const std::string& session, const std::string& comm_id, int rank, int nranks,
                    uint32_t timeout_ms = 0) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::InitCommRequest req;
    req.set_session_id(session);
    req.set_comm_id(comm_id);
    req.set_rank(rank);
    req.set_nranks(nranks);
    req.set_timeout_ms(timeout_ms);
    v1::InitCommResponse resp;
    return stub_->InitComm(&ctx, req, &resp);
  }

 private:
  std::unique_ptr<v1::Local::Stub> stub_;
};

v1::SubmitRequest AllReduceRequest(const Client& c, const Comm& comm, const Buffer& b,
                                   uint64_t count) {
  v1::SubmitRequest req;
  req.set_session_id(c.session_id());
  req.set_comm_handle(comm.handle());
  req.set_request_id(1u << 30);
  req.set_op(v1::COLLECTIVE_OP_ALL_REDUCE);
  req.set_dtype(v1::DATA_TYPE_FLOAT32);
  req.set_red_op(v1::RED_OP_SUM);
  req.set_count(count);
  req.mutable_send()->set_buffer_id(b.id());
  req.mutable_recv()->set_buffer_id(b.id());
  return req;
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ready()) << daemon_.Log(); }

  // A one-rank communicator with a 4 KiB buffer.
  void OneRank(std::unique_ptr<Client>* client, Comm* comm, Buffer* buf,
               const std::string& job = "itest") {
    auto c = Client::Connect(daemon_.Options(job));
    ASSERT_TRUE(c.ok()) << c.status();
    auto b = (*c)->Allocate(4096);
    ASSERT_TRUE(b.ok()) << b.status();
    auto id = (*c)->CreateCommId();
    ASSERT_TRUE(id.ok());
    auto m = (*c)->InitComm(*id, 0, 1);
    ASSERT_TRUE(m.ok()) << m.status();
    *client = *std::move(c);
    *comm = *std::move(m);
    *buf = *std::move(b);
  }

  // The daemon still runs a collective correctly.
  void ExpectStillServing() {
    std::unique_ptr<Client> c;
    Comm comm;
    Buffer b;
    OneRank(&c, &comm, &b, "after");
    b.span<float>()[0] = 2.5f;
    ASSERT_TRUE(comm.AllReduce(b, b, 1, DataType::kFloat32, RedOp::kSum).wait().ok());
    EXPECT_EQ(b.span<float>()[0], 2.5f);
  }

  DaemonProcess daemon_;
};

TEST_F(BadInputTest, GarbageBytesOnTheSocket) {
  std::mt19937 rng(42);
  for (int round = 0; round < 3; ++round) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, daemon_.socket().c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    std::string junk;
    if (round == 1) junk = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";  // valid preface, then garbage
    for (int i = 0; i < 8192; ++i) junk.push_back(static_cast<char>(rng()));
    (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    char sink[256];
    timeval tv{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)::recv(fd, sink, sizeof(sink), 0);
    ::close(fd);
  }
  ExpectStillServing();
  EXPECT_EQ(daemon_.Status().sessions_size(), 0);
}

TEST_F(BadInputTest, UnknownSessionIsNotFound) {
  RawLocal raw(daemon_);
  v1::SubmitRequest req;
  req.set_session_id("00000000000000000000000000000000");
  grpc::Status s = raw.Submit(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("unknown session"));
}

TEST_F(BadInputTest, ForeignAndUnknownHandlesAreNotFound) {
  std::unique_ptr<Client> a, b;
  Comm ca, cb;
  Buffer ba, bb;
  OneRank(&a, &ca, &ba, "job-a");
  OneRank(&b, &cb, &bb, "job-b");
  RawLocal raw(daemon_);
  // Job b names job a's buffer.
  v1::SubmitRequest req = AllReduceRequest(*b, cb, bb, 4);
  req.mutable_send()->set_buffer_id(ba.id());
  grpc::Status s = raw.Submit(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("send buffer"));
  // Job b names job a's communicator.
  req = AllReduceRequest(*b, cb, bb, 4);
  req.set_comm_handle(ca.handle());
  s = raw.Submit(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("comm handle"));
  // A buffer id that never existed.
  req = AllReduceRequest(*b, cb, bb, 4);
  req.mutable_recv()->set_buffer_id(987654321);
  s = raw.Submit(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("recv buffer 987654321"));
  // Releasing another session's buffer.
  grpc::ClientContext ctx;
  v1::ReleaseBufferRequest rel;
  rel.set_session_id(b->session_id());
  rel.set_buffer_id(ba.id());
  v1::ReleaseBufferResponse resp;
  s = v1::Local::NewStub(daemon_.Channel())->ReleaseBuffer(&ctx, rel, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  // Both jobs' own collectives still work.
  ba.span<float>()[0] = 1.0f;
  EXPECT_TRUE(ca.AllReduce(ba, ba, 1, DataType::kFloat32, RedOp::kSum).wait().ok());
}

TEST_F(BadInputTest, RegionsPastTheEndOrMisalignedAreInvalid) {
  std::unique_ptr<Client> c;
  Comm comm;
  Buffer b;
  OneRank(&c, &comm, &b);
  RawLocal raw(daemon_);
  v1::SubmitRequest req = AllReduceRequest(*c, comm, b, 1025);  // 4100 bytes > 4096
  grpc::Status s = raw.Submit(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("past the end of the 4096-byte buffer by 4 bytes"));
  req = AllReduceRequest(*c, comm, b, 16);
  req.mutable_recv()->set_offset(4090);
  s = raw.Submit(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("not a multiple of the element size 4"));
  req.mutable_recv()->set_offset(uint64_t{1} << 63);
  s = raw.Submit(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  req = AllReduceRequest(*c, comm, b, uint64_t{1} << 62);  // byte count overflows
  s = raw.Submit(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("2^48"));
  // Overlapping send and recv that are not the in-place layout.
  req = AllReduceRequest(*c, comm, b, 16);
  req.mutable_recv()->set_offset(8);
  s = raw.Submit(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("overlap"));
  // Nothing was consumed: the next valid operation is sequence 0 and completes.
  b.span<float>()[0] = 3.0f;
  EXPECT_TRUE(comm.AllReduce(b, b, 1, DataType::kFloat32, RedOp::kSum).wait().ok());
  EXPECT_EQ(b.span<float>()[0], 3.0f);
}

TEST_F(BadInputTest, SizesAndOffsetsThatOverflow64BitsAreInvalidAndSayWhichField) {
  std::unique_ptr<Client> c;
  Comm comm;
  Buffer b;
  OneRank(&c, &comm, &b);
  RawLocal raw(daemon_);
  constexpr uint64_t kMax = ~uint64_t{0};
  auto alltoallv = [&](uint64_t send_count, uint64_t send_displ, uint64_t recv_count,
                       uint64_t recv_displ) {
    v1::SubmitRequest req = AllReduceRequest(*c, comm, b, 0);
    req.set_op(v1::COLLECTIVE_OP_ALL_TO_ALL_V);
    req.add_send_counts(send_count);
    req.add_send_displs(send_displ);
    req.add_recv_counts(recv_count);
    req.add_recv_displs(recv_displ);
    return req;
  };
  struct Case {
    const char* what;
    v1::SubmitRequest req;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"count x size overflows", AllReduceRequest(*c, comm, b, uint64_t{1} << 62),
                   "count 4611686018427387904 x 4-byte elements overflows 64 bits"});
  cases.push_back({"negative-ish count (-4)", AllReduceRequest(*c, comm, b, kMax - 3),
                   "count 18446744073709551612 x 4-byte elements overflows 64 bits"});
  {
    v1::SubmitRequest req = AllReduceRequest(*c, comm, b, uint64_t{1} << 50);
    req.set_dtype(v1::DATA_TYPE_INT8);
    cases.push_back({"count past 2^48", req,
                     "count 1125899906842624 x 1-byte elements = 1125899906842624 bytes exceeds "
                     "the 2^48-byte limit of one operation by 844424930131968 bytes"});
  }
  {
    v1::SubmitRequest req = AllReduceRequest(*c, comm, b, 16);
    req.mutable_recv()->set_offset(kMax - 3);  // aligned to 4
    cases.push_back({"offset near UINT64_MAX", req,
                     absl::StrCat("recv buffer ", b.id(),
                                  ": offset 18446744073709551612 + 64 bytes overflows 64 bits "
                                  "(the buffer has 4096 bytes)")});
  }
  {
    v1::SubmitRequest req = AllReduceRequest(*c, comm, b, 16);
    req.mutable_send()->set_offset(8192);
    cases.push_back({"offset past the end", req,
                     absl::StrCat("send buffer ", b.id(),
                                  ": offset 8192 is past the end of the 4096-byte buffer by "
                                  "4096 bytes")});
  }
  cases.push_back({"alltoallv displacement overflows", alltoallv(4, kMax - 1, 0, 0),
                   "send block for rank 0: send_displs[0] 18446744073709551614 + send_counts[0] 4 "
                   "elements of 4 bytes overflows 64 bits"});
  cases.push_back({"alltoallv count overflows", alltoallv(0, 0, kMax, 0),
                   "recv block for rank 0: recv_displs[0] 0 + recv_counts[0] "
                   "18446744073709551615 elements of 4 bytes overflows 64 bits"});
  cases.push_back({"alltoallv block past 2^48", alltoallv(1, uint64_t{1} << 46, 0, 0),
                   "send block for rank 0: send_displs[0] 70368744177664 + send_counts[0] 1 "
                   "elements of 4 bytes ends at byte 281474976710660, past the 2^48-byte limit "
                   "of one operation by 4 bytes"});
  cases.push_back({"alltoallv block past the buffer", alltoallv(8, 1020, 0, 0),
                   absl::StrCat("send buffer ", b.id(),
                                ": region [0, 4112) runs past the end of "
                                "the 4096-byte buffer by 16 bytes")});
  for (const Case& k : cases) {
    grpc::Status s = raw.Submit(k.req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << k.what;
    EXPECT_THAT(s.error_message(), HasSubstr(k.message)) << k.what;
  }
  // Nothing was consumed: the communicator's next operation is sequence 0 and completes.
  b.span<float>()[0] = 1.5f;
  Work w = comm.AllReduce(b, b, 1, DataType::kFloat32, RedOp::kSum);
  ASSERT_TRUE(w.wait().ok());
  EXPECT_EQ(b.span<float>()[0], 1.5f);
  ExpectStillServing();
}

TEST_F(BadInputTest, BadEnumsRootsAndAlgorithmsAreInvalid) {
  std::unique_ptr<Client> c;
  Comm comm;
  Buffer b;
  OneRank(&c, &comm, &b);
  RawLocal raw(daemon_);
  struct Mutation {
    const char* what;
    std::function<void(v1::SubmitRequest*)> apply;
    const char* message;
  };
  const std::vector<Mutation> mutations = {
      {"op", [](auto* r) { r->set_op(v1::COLLECTIVE_OP_UNSPECIFIED); }, "not a collective"},
      {"op 99", [](auto* r) { r->set_op(static_cast<v1::CollectiveOp>(99)); }, "not a collective"},
      {"dtype", [](auto* r) { r->set_dtype(v1::DATA_TYPE_UNSPECIFIED); }, "not a supported data"},
      {"red_op", [](auto* r) { r->set_red_op(static_cast<v1::RedOp>(42)); }, "not a reduction"},
      {"algo", [](auto* r) { r->set_algo("magic"); }, "unknown algo 'magic'"},
      {"compression", [](auto* r) { r->set_compression("zstd"); },
       "compression 'zstd' is not a codec"},
      {"topk ratio", [](auto* r) { r->set_compression("topk:2"); }, "topk"},
      {"int8 block", [](auto* r) { r->set_compression("int8:3"); }, "int8"},
      {"compression_key",
       [](auto* r) {
         r->set_compression("int8");
         r->set_compression_key(7);
       },
       "compression_key is set but error_feedback is not"},
      {"root",
       [](auto* r) {
         r->set_op(v1::COLLECTIVE_OP_BROADCAST);
         r->set_root(1);
       },
       "root 1 not in [0, 1)"},
      {"peer",
       [](auto* r) {
         r->set_op(v1::COLLECTIVE_OP_SEND);
         r->set_root(0);
       },
       "to itself"},
      {"alltoallv vectors",
       [](auto* r) {
         r->set_op(v1::COLLECTIVE_OP_ALL_TO_ALL_V);
         r->add_send_counts(1);
       },
       "need 1 entries"},
  };
  for (const auto& m : mutations) {
    v1::SubmitRequest req = AllReduceRequest(*c, comm, b, 4);
    m.apply(&req);
    grpc::Status s = raw.Submit(req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << m.what;
    EXPECT_THAT(s.error_message(), HasSubstr(m.message)) << m.what;
  }
}

TEST_F(BadInputTest, BadBuffersAndCommIdsAreRefused) {
  auto c = Client::Connect(daemon_.Options());
  ASSERT_TRUE(c.ok());
  RawLocal raw(daemon_);
  const std::string sid = (*c)->session_id();
  // Buffers come only as descriptors sent on the session's own side channel: a handle it never
  // gave out names nothing (the adversarial suite sends real bad descriptors).
  for (uint64_t handle : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, ~uint64_t{0}}) {
    grpc::Status s = raw.Register(sid, handle, 4096);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << handle;
    EXPECT_THAT(s.error_message(), HasSubstr("was not given out on this session's side channel"));
  }
  grpc::Status s;
  s = raw.Init(sid, "not-a-comm-id", 0, 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("malformed comm id"));
  s = raw.Init(sid, "ry1-0123456789abcdef0123456789abcdef@10.1.2.3:7000", 0, 2);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(s.error_message(), HasSubstr("10.1.2.3:7000"));
  // Coordinators gRPC would read as a target of another scheme, and another daemon's local: id
  // (never dialled).
  for (const char* coordinator : {"unix:/run/railyard.sock", "dns:///coord:7000", "local:other"}) {
    s = raw.Init(sid, absl::StrCat("ry1-0123456789abcdef0123456789abcdef@", coordinator), 0, 2);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << coordinator;
    EXPECT_THAT(s.error_message(), HasSubstr(coordinator));
  }
  auto id = (*c)->CreateCommId();
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(raw.Init(sid, *id, 2, 2).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(raw.Init(sid, *id, 0, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // More ranks than a tag's rank field numbers (daemon/scheduler/tags.h).
  s = raw.Init(sid, *id, 0, 65537);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("nranks 65537 not in [1, 65536]"));
  // Joining twice as the same rank.
  auto comm = (*c)->InitComm(*id, 0, 1);
  ASSERT_TRUE(comm.ok());
  EXPECT_EQ(raw.Init(sid, *id, 0, 1).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  ExpectStillServing();
}

TEST(JobTokensTest, WrongTokenIsPermissionDenied) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready());
  auto first = Client::Connect(daemon.Options("tok", "secret"));
  ASSERT_TRUE(first.ok()) << first.status();
  auto wrong = Client::Connect(daemon.Options("tok", "guess"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("wrong token for job tok"));
  auto right = Client::Connect(daemon.Options("tok", "secret"));
  EXPECT_TRUE(right.ok()) << right.status();
  auto bad_job = Client::Connect(daemon.Options("no spaces allowed"));
  ASSERT_FALSE(bad_job.ok());
  EXPECT_EQ(bad_job.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobTokensTest, TokensFileIsEnforced) {
  const std::string dir = MakeTempDir();
  {
    std::ofstream f(dir + "/tokens");
    f << "# job token\ntrain-1 s3cret\n";
  }
  DaemonProcess daemon({"--job_tokens=" + dir + "/tokens"});
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  EXPECT_TRUE(Client::Connect(daemon.Options("train-1", "s3cret")).ok());
  auto wrong = Client::Connect(daemon.Options("train-1", "nope"));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied);
  auto unlisted = Client::Connect(daemon.Options("train-2", "s3cret"));
  EXPECT_EQ(unlisted.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(unlisted.status().message()), HasSubstr("not listed"));
  std::filesystem::remove_all(dir);
}

// n ranks of one communicator of `job` as clients of this process (each its own session).
void RanksOf(const DaemonProcess& daemon, int n, const std::string& job,
             std::vector<std::unique_ptr<Client>>* clients, std::vector<Comm>* comms,
             std::vector<Buffer>* bufs) {
  std::vector<std::unique_ptr<Client>> cs;
  for (int r = 0; r < n; ++r) {
    auto c = Client::Connect(daemon.Options(job));
    ASSERT_TRUE(c.ok()) << c.status();
    auto b = (*c)->Allocate(4096);
    ASSERT_TRUE(b.ok());
    bufs->push_back(*std::move(b));
    cs.push_back(*std::move(c));
  }
  auto id = cs[0]->CreateCommId();
  ASSERT_TRUE(id.ok());
  std::vector<std::thread> joiners;
  comms->resize(n);
  for (int r = 0; r < n; ++r) {
    joiners.emplace_back([&, r] {
      auto m = cs[r]->InitComm(*id, r, n);
      ASSERT_TRUE(m.ok()) << m.status();
      (*comms)[r] = *std::move(m);
    });
  }
  for (auto& t : joiners) t.join();
  *clients = std::move(cs);
}

// Two or three ranks as clients of this process (each its own session).
class MultiRankTest : public BadInputTest {
 protected:
  void Ranks(int n, std::vector<std::unique_ptr<Client>>* clients, std::vector<Comm>* comms,
             std::vector<Buffer>* bufs) {
    RanksOf(daemon_, n, "multi", clients, comms, bufs);
  }
};

TEST_F(MultiRankTest, MismatchedCollectivesFailOnEveryRankAndAbortTheComm) {
  struct Variant {
    const char* field;
    std::function<Work(Comm&, Buffer&, int rank)> submit;
  };
  const std::vector<Variant> variants = {
      {"count",
       [](Comm& c, Buffer& b, int r) {
         return c.AllReduce(b, b, r == 0 ? 8 : 9, DataType::kFloat32, RedOp::kSum);
       }},
      {"dtype",
       [](Comm& c, Buffer& b, int r) {
         return c.AllReduce(b, b, 8, r == 0 ? DataType::kFloat32 : DataType::kInt32, RedOp::kSum);
       }},
      {"red_op",
       [](Comm& c, Buffer& b, int r) {
         return c.AllReduce(b, b, 8, DataType::kFloat32, r == 0 ? RedOp::kSum : RedOp::kMax);
       }},
      {"op",
       [](Comm& c, Buffer& b, int r) {
         return r == 0 ? c.AllReduce(b, b, 8, DataType::kFloat32, RedOp::kSum)
                       : c.Broadcast(b, b, 8, DataType::kFloat32, 0);
       }},
      {"root", [](Comm& c, Buffer& b,
                  int r) { return c.Broadcast(b, b, 8, DataType::kFloat32, r == 0 ? 0 : 1); }},
  };
  for (const auto& v : variants) {
    std::vector<std::unique_ptr<Client>> clients;
    std::vector<Comm> comms;
    std::vector<Buffer> bufs;
    Ranks(2, &clients, &comms, &bufs);
    Work w0 = v.submit(comms[0], bufs[0], 0);
    Work w1 = v.submit(comms[1], bufs[1], 1);
    for (Work* w : {&w0, &w1}) {
      absl::Status s = w->wait(std::chrono::seconds(10));
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << v.field << ": " << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr(std::string("disagree on ") + v.field)) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0"));
      EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1"));
    }
    // The communicator stays failed, like ncclCommAbort.
    absl::Status later = comms[0].Barrier().wait(std::chrono::seconds(10));
    EXPECT_EQ(later.code(), absl::StatusCode::kAborted) << later;
  }
  ExpectStillServing();
}

TEST_F(MultiRankTest, RanksThatNeverSubmitAreNamedAfterTheDeadline) {
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<Comm> comms;
  std::vector<Buffer> bufs;
  Ranks(3, &clients, &comms, &bufs);
  CollectiveOptions o;
  o.timeout = std::chrono::milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  Work w = comms[0].AllReduce(bufs[0], bufs[0], 4, DataType::kFloat32, RedOp::kSum, o);
  absl::Status s = w.wait(std::chrono::seconds(10));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("ranks 1, 2 of 3 did not submit"));
  EXPECT_GE(elapsed, std::chrono::milliseconds(250));
  EXPECT_LT(elapsed, std::chrono::seconds(5));
  // Send without a matching recv times out too, naming the peer.
  std::vector<std::unique_ptr<Client>> c2;
  std::vector<Comm> m2;
  std::vector<Buffer> b2;
  Ranks(2, &c2, &m2, &b2);
  s = m2[0].Send(b2[0], 4, DataType::kFloat32, 1, o).wait(std::chrono::seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 did not post the matching recv"));
}

TEST_F(MultiRankTest, JoinDeadlineNamesMissingRanks) {
  auto c = Client::Connect(daemon_.Options());
  ASSERT_TRUE(c.ok());
  auto id = (*c)->CreateCommId();
  ASSERT_TRUE(id.ok());
  auto comm = (*c)->InitComm(*id, 0, 3, std::chrono::milliseconds(200));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("ranks 1, 2 of 3 did not join"));
}

TEST_F(MultiRankTest, SendRecvMismatchAndDestroyedPeer) {
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<Comm> comms;
  std::vector<Buffer> bufs;
  Ranks(2, &clients, &comms, &bufs);
  Work s = comms[0].Send(bufs[0], 4, DataType::kFloat32, 1);
  Work r = comms[1].Recv(bufs[1], 5, DataType::kFloat32, 0);
  EXPECT_EQ(s.wait(std::chrono::seconds(10)).code(), absl::StatusCode::kInvalidArgument);
  absl::Status rs = r.wait(std::chrono::seconds(10));
  EXPECT_EQ(rs.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(rs.message()), HasSubstr("sends 4 x float to rank 1, which receives 5"));

  std::vector<std::unique_ptr<Client>> c2;
  std::vector<Comm> m2;
  std::vector<Buffer> b2;
  Ranks(2, &c2, &m2, &b2);
  Work pending = m2[0].AllReduce(b2[0], b2[0], 4, DataType::kFloat32, RedOp::kSum);
  ASSERT_TRUE(m2[1].Destroy().ok());
  absl::Status ps = pending.wait(std::chrono::seconds(10));
  EXPECT_EQ(ps.code(), absl::StatusCode::kAborted) << ps;
  EXPECT_THAT(std::string(ps.message()), HasSubstr("rank 1 destroyed communicator"));
}

// Queue quotas (--max_queued_ops_per_session, --max_queued_p2p_per_session) against a live
// daemon: the rank that runs ahead is refused with RESOURCE_EXHAUSTED naming the flag, the
// communicator keeps working, and the rank submits again once the backlog drains.
TEST(QuotaTest, RanksRunningAheadOfTheQuotaAreRefusedAndResumeOnceTheBacklogDrains) {
  DaemonProcess daemon({"--max_queued_ops_per_session=2", "--max_queued_p2p_per_session=1"});
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<Comm> comms;
  std::vector<Buffer> bufs;
  RanksOf(daemon, 2, "quota", &clients, &comms, &bufs);
  ASSERT_EQ(comms.size(), 2u);
  auto allreduce = [&](int r) {
    return comms[r].AllReduce(bufs[r], bufs[r], 4, DataType::kFloat32, RedOp::kSum);
  };
  std::vector<Work> ahead;
  ahead.push_back(allreduce(0));
  ahead.push_back(allreduce(0));
  absl::Status over = allreduce(0).wait(std::chrono::seconds(10));
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_THAT(std::string(over.message()),
              HasSubstr("operations queued ahead of the slowest rank limit of this session (2) "
                        "reached: it holds 2 and asked for 1 more (--max_queued_ops_per_session)"));
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(allreduce(1).wait(std::chrono::seconds(10)).ok());
  for (Work& w : ahead) ASSERT_TRUE(w.wait(std::chrono::seconds(10)).ok());
  Work a = allreduce(0);  // the refused one took no sequence number: both ranks agree
  ASSERT_TRUE(allreduce(1).wait(std::chrono::seconds(10)).ok());
  ASSERT_TRUE(a.wait(std::chrono::seconds(10)).ok());

  Work send = comms[0].Send(bufs[0], 8, DataType::kFloat32, 1);
  absl::Status second =
      comms[0].Send(bufs[0], 8, DataType::kFloat32, 1).wait(std::chrono::seconds(10));
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_THAT(std::string(second.message()), HasSubstr("send of rank 0 on communicator"));
  EXPECT_THAT(std::string(second.message()), HasSubstr("(--max_queued_p2p_per_session)"));
  ASSERT_TRUE(comms[1].Recv(bufs[1], 8, DataType::kFloat32, 0).wait(std::chrono::seconds(10)).ok());
  ASSERT_TRUE(send.wait(std::chrono::seconds(10)).ok());
  // The pair after it matches as the next one.
  Work again = comms[0].Send(bufs[0], 8, DataType::kFloat32, 1);
  ASSERT_TRUE(comms[1].Recv(bufs[1], 8, DataType::kFloat32, 0).wait(std::chrono::seconds(10)).ok());
  ASSERT_TRUE(again.wait(std::chrono::seconds(10)).ok());
  EXPECT_EQ(daemon.Status().comms(0).ops_failed(), 0u);
}

}  // namespace
}  // namespace railyard::testing
