// Staging a device-memory request through host memory (daemon/submit/device_staging.h), on the fake
// device runtime: the request is pointed at host copies holding the device's data, the results
// go back to the device before the completion is forwarded, and a failed copy leaves the request
// as it was with an error naming it.
#include "daemon/submit/device_staging.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/device/fake_device_runtime.h"

namespace railyard {
namespace {

class Recorder : public CompletionSink {
 public:
  void PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) override {
    absl::MutexLock lock(&mu_);
    id_ = request_id;
    status_ = status;
    seq_ = seq;
    done_ = true;
  }
  bool done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  bool WaitDone() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(10));
  }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  uint64_t id() {
    absl::MutexLock lock(&mu_);
    return id_;
  }

 private:
  absl::Mutex mu_;
  bool done_ = false;
  uint64_t id_ = 0, seq_ = 0;
  absl::Status status_;
};

struct FakeBuffer {
  FakeBuffer(device::FakeDeviceRuntime* rt, size_t bytes) {
    absl::StatusOr<UniqueFd> fd = device::FakeDeviceRuntime::Allocate(0, bytes);
    view = static_cast<float*>(
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0));
    this->bytes = bytes;
    segment = MappedSegment::FromDevice(*rt->Import(0, *std::move(fd), bytes));
  }
  ~FakeBuffer() { ::munmap(view, bytes); }
  float* view;
  size_t bytes;
  std::shared_ptr<MappedSegment> segment;
};

// An AllReduce of `count` floats from send into recv, device memory of device 0.
PendingRequest AllReduceOn(FakeBuffer* send, FakeBuffer* recv, size_t count) {
  PendingRequest p;
  p.request_id = 1;
  p.req.op = scheduler::OpKind::kAllReduce;
  p.req.count = count;
  p.req.send = send->segment->data();
  p.req.recv = recv->segment->data();
  p.req.device = 0;
  p.send_segment = send->segment;
  p.recv_segment = recv->segment;
  return p;
}

TEST(DeviceStagingTest, TheRequestRunsOnHostCopiesAndItsResultReachesTheDeviceFirst) {
  device::FakeDeviceRuntime rt(1);
  device::StagingPool pool(&rt, 1 << 20);
  scheduler::Executor executor(1);
  constexpr size_t kCount = 1000;
  FakeBuffer send(&rt, kCount * 4), recv(&rt, kCount * 4);
  for (size_t i = 0; i < kCount; ++i) {
    send.view[i] = static_cast<float>(i);
    recv.view[i] = -1.0f;
  }
  auto client = std::make_shared<Recorder>();
  PendingRequest p = AllReduceOn(&send, &recv, kCount);
  p.request_id = 7;
  p.session = client;
  ASSERT_TRUE(StageThroughHost(&p, 2, &rt, &pool, &executor).ok());
  EXPECT_EQ(p.req.device, -1);
  // Host memory now, holding what the device held (this read would fault on device addresses).
  const auto* staged_send = reinterpret_cast<const float*>(p.req.send);
  EXPECT_EQ(staged_send[999], 999.0f);
  auto* staged_recv = reinterpret_cast<float*>(p.req.recv);
  EXPECT_NE(staged_recv[0], -1.0f);  // an AllReduce writes all of it: not copied in
  for (size_t i = 0; i < kCount; ++i) staged_recv[i] = 2.0f * static_cast<float>(i);
  EXPECT_EQ(recv.view[5], -1.0f);  // not yet on the device
  auto sink = p.session.lock();
  ASSERT_NE(sink, client);
  sink->PostCompletion(7, absl::OkStatus(), 3);
  ASSERT_TRUE(client->WaitDone());
  EXPECT_TRUE(client->status().ok()) << client->status();
  EXPECT_EQ(client->id(), 7u);
  EXPECT_EQ(recv.view[5], 10.0f);
  EXPECT_EQ(send.view[5], 5.0f);  // out of place: the send buffer is not written back
}

// The pool's buffers serve one operation after another (possibly another tenant's). What reaches
// the device is the operation's own: a failed operation copies nothing back, a successful one its
// result, and where it may leave bytes unwritten (AllToAllv) they were copied in from its own
// device memory first.
TEST(DeviceStagingTest, ReusedBuffersBringNothingOfAnEarlierOperationToTheDevice) {
  device::FakeDeviceRuntime rt(1);
  device::StagingPool pool(&rt, 64 << 20);
  scheduler::Executor executor(1);
  constexpr size_t kCount = 50000;
  FakeBuffer send_a(&rt, kCount * 4), recv_a(&rt, kCount * 4);
  FakeBuffer send_b(&rt, kCount * 4), recv_b(&rt, kCount * 4);
  for (size_t i = 0; i < kCount; ++i) {
    send_a.view[i] = 1.0f;
    send_b.view[i] = 3.0f;
    recv_b.view[i] = 4.0f;
  }
  // Runs one staged operation that writes `result` into staged recv elements [from, to) (and
  // [from2, to2)); `fail`: it ends with an error.
  auto run = [&](PendingRequest p, float result, size_t from, size_t to, bool fail,
                 size_t from2 = 0, size_t to2 = 0) -> absl::Status {
    auto client = std::make_shared<Recorder>();
    p.session = client;
    if (absl::Status s = StageThroughHost(&p, 2, &rt, &pool, &executor); !s.ok()) return s;
    auto* staged = reinterpret_cast<float*>(p.req.recv);
    for (size_t i = from; i < to; ++i) staged[i] = result;
    for (size_t i = from2; i < to2; ++i) staged[i] = result;
    p.session.lock()->PostCompletion(1, fail ? absl::InternalError("peer gone") : absl::OkStatus(),
                                     0);
    if (!client->WaitDone()) return absl::DeadlineExceededError("no completion");
    // The leases go back when the last holder of the staging sink lets go: this request, and the
    // device thread's copy-back task, which may still be finishing after it completed the client.
    p = PendingRequest();
    for (int i = 0; i < 10000 && pool.stats().leased_bytes != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (pool.stats().leased_bytes != 0) return absl::DeadlineExceededError("leases not returned");
    return client->status();
  };
  ASSERT_TRUE(run(AllReduceOn(&send_a, &recv_a, kCount), 99.0f, 0, kCount, false).ok());
  EXPECT_EQ(recv_a.view[kCount - 1], 99.0f);
  EXPECT_EQ(pool.stats().idle_buffers, 2u);

  // B reuses A's buffers (A's 99s are in them); it fails after writing one element.
  EXPECT_EQ(run(AllReduceOn(&send_b, &recv_b, kCount), 7.0f, 0, 1, true).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(pool.stats().reuses, 2u);
  EXPECT_EQ(rt.pinned_allocations(), 2u);
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(recv_b.view[i], 4.0f) << i;  // untouched

  // AllToAllv receiving blocks [0, N/4) and [N/2, 3N/4): the gap between them comes back as the
  // device held it, not as the reused buffer did.
  PendingRequest v = AllReduceOn(&send_b, &recv_b, 0);
  v.req.op = scheduler::OpKind::kAllToAllv;
  v.req.send_counts = {kCount / 4, kCount / 4};
  v.req.send_displs = {0, kCount / 4};
  v.req.recv_counts = {kCount / 4, kCount / 4};
  v.req.recv_displs = {0, kCount / 2};
  ASSERT_TRUE(run(std::move(v), 5.0f, 0, kCount / 4, false, kCount / 2, 3 * kCount / 4).ok());
  for (size_t i = 0; i < 3 * kCount / 4; ++i) {
    const bool received = i < kCount / 4 || i >= kCount / 2;
    ASSERT_EQ(recv_b.view[i], received ? 5.0f : 4.0f) << i;
  }
}

TEST(DeviceStagingTest, AFailedCopyLeavesTheRequestAsItWas) {
  device::FakeDeviceRuntime rt(1);
  device::StagingPool pool(&rt, 1 << 20);
  scheduler::Executor executor(1);
  FakeBuffer send(&rt, 4096);
  PendingRequest p;
  p.req.op = scheduler::OpKind::kAllReduce;
  p.req.count = 2048;  // 8192 bytes: past the 4096-byte mapping
  p.req.send = send.segment->data();
  p.req.recv = send.segment->data();
  p.req.device = 0;
  absl::Status s = StageThroughHost(&p, 2, &rt, &pool, &executor);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("copying device 0 memory to host memory before the operation"),
            std::string::npos)
      << s;
  EXPECT_EQ(p.req.device, 0);
  EXPECT_EQ(p.req.send, send.segment->data());
  EXPECT_EQ(p.sink_owner, nullptr);
}

// On a device's thread a staging copy goes kStagingCopyChunk bytes at a time (HostStaging::CopyIn's
// bound; the copy back a task per chunk), so that the device's other queued work (another
// tenant's operation) runs before a large copy has finished. Every byte still arrives.
TEST(DeviceStagingTest, CopiesGoAChunkAtATimeAndTheDevicesOtherWorkRunsInBetween) {
  device::FakeDeviceRuntime rt(1);
  device::StagingPool pool(&rt, 64 << 20);
  scheduler::Executor executor(1);
  executor.SetDeviceRuntime(&rt);  // a thread for device 0, taking its tasks in order
  constexpr size_t kCount = 3 * kStagingCopyChunk / 4 + 1000;  // 3 chunks and 4000 bytes
  FakeBuffer send(&rt, kCount * 4), recv(&rt, kCount * 4);
  for (size_t i = 0; i < kCount; ++i) {
    send.view[i] = static_cast<float>(i % 1009);
    recv.view[i] = -1.0f;
  }
  auto client = std::make_shared<Recorder>();
  PendingRequest p = AllReduceOn(&send, &recv, kCount);
  p.request_id = 7;
  p.session = client;
  absl::StatusOr<std::unique_ptr<HostStaging>> staging = HostStaging::Prepare(p, 2, &pool);
  ASSERT_TRUE(staging.ok()) << staging.status();
  EXPECT_EQ(p.req.device, 0);  // Prepare changes nothing
  int calls = 0;
  for (bool all = false; !all; ++calls) {
    absl::StatusOr<bool> copied = (*staging)->CopyIn(&rt, kStagingCopyChunk);
    ASSERT_TRUE(copied.ok()) << copied.status();
    all = *copied;
    ASSERT_LT(calls, 10);
  }
  EXPECT_EQ(calls, 4);  // the send region only: an AllReduce writes all of its recv region
  HostStaging::Attach(*std::move(staging), &p, &rt, &executor);
  ASSERT_EQ(p.req.device, -1);
  const auto* staged_send = reinterpret_cast<const float*>(p.req.send);
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(staged_send[i], static_cast<float>(i % 1009)) << "element " << i;
  }
  auto* staged_recv = reinterpret_cast<float*>(p.req.recv);
  for (size_t i = 0; i < kCount; ++i) staged_recv[i] = static_cast<float>(i % 1013);
  // The device's thread is held until the copy back's first chunk and another task are queued
  // behind it, in that order: the other task then runs before the copy back's second chunk.
  absl::Notification go, other_ran;
  bool done_when_other_ran = true;
  float last_when_other_ran = 0.0f;
  executor.PostToDevice(0, [&] { go.WaitForNotification(); });
  p.session.lock()->PostCompletion(7, absl::OkStatus(), 3);
  executor.PostToDevice(0, [&] {
    done_when_other_ran = client->done();
    last_when_other_ran = recv.view[kCount - 1];
    other_ran.Notify();
  });
  go.Notify();
  ASSERT_TRUE(client->WaitDone());
  ASSERT_TRUE(other_ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(done_when_other_ran);
  EXPECT_EQ(last_when_other_ran, -1.0f);  // the last chunk was still to come
  EXPECT_TRUE(client->status().ok()) << client->status();
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(recv.view[i], static_cast<float>(i % 1013)) << "element " << i;
  }
}

// A pipelined staging of request p (HostStaging::Gate, then Attach before any copy in), on a
// device thread of its own, with its host memory from a pool.
struct Pipelined {
  explicit Pipelined(device::FakeDeviceRuntime* rt) : pool(rt, 64 << 20) {
    executor.SetDeviceRuntime(rt);
  }
  // Stages p; false (a test failure) if Prepare refused it.
  bool Stage(PendingRequest* p, device::FakeDeviceRuntime* rt) {
    absl::StatusOr<std::unique_ptr<HostStaging>> prepared = HostStaging::Prepare(*p, 2, &pool);
    EXPECT_TRUE(prepared.ok()) << prepared.status();
    if (!prepared.ok()) return false;
    staging = *std::move(prepared);
    gate = staging->Gate();
    HostStaging::Attach(staging, p, rt, &executor, 4096);
    return true;
  }
  device::StagingPool pool;
  scheduler::Executor executor{1};
  std::shared_ptr<HostStaging> staging;
  std::shared_ptr<scheduler::FillGate> gate;
};

// Pipelined (HostStaging::Gate): the request is attached before anything is copied in and
// carries the gate its operation's steps wait on; each chunk copied opens the bytes it filled,
// and an operation that ends before the copy in has finished (here: at once, in place) gets its
// result back only after it has, so no leased buffer's old bytes reach the device.
TEST(DeviceStagingTest, APipelinedRequestsStepsWaitForTheirChunksAndTheCopyBackForTheWholeCopy) {
  device::FakeDeviceRuntime rt(1);
  constexpr size_t kCount = 3 * 4096 / 4;  // 3 chunks of 4096 bytes
  FakeBuffer buf(&rt, kCount * 4);
  for (size_t i = 0; i < kCount; ++i) buf.view[i] = static_cast<float>(i % 997);
  auto client = std::make_shared<Recorder>();
  PendingRequest p = AllReduceOn(&buf, &buf, kCount);  // in place: one region, in and back
  p.request_id = 9;
  p.session = client;
  Pipelined staged(&rt);
  ASSERT_TRUE(staged.Stage(&p, &rt));
  std::shared_ptr<HostStaging> staging = staged.staging;
  std::shared_ptr<scheduler::FillGate> gate = staged.gate;
  ASSERT_EQ(p.input_gate, gate);
  std::byte* host = p.req.send;
  ASSERT_EQ(p.req.recv, host);
  // A step touching the second chunk waits; one before it would not.
  absl::Notification second_chunk;
  absl::Status woke_with = absl::UnknownError("not woken");
  std::function<void(absl::Status)> wake = [&](absl::Status st) {
    woke_with = st;
    second_chunk.Notify();
  };
  ASSERT_FALSE(gate->Admit(host + 4096, 4096, wake));
  // The operation "ends" now, before any copy in: its completion must wait for the copy.
  p.session.lock()->PostCompletion(9, absl::OkStatus(), 4);
  EXPECT_FALSE(client->done());
  absl::StatusOr<bool> copied = staging->CopyIn(&rt, 4096);
  ASSERT_TRUE(copied.ok() && !*copied);
  EXPECT_FALSE(second_chunk.HasBeenNotified());
  std::function<void(absl::Status)> unused = [](absl::Status) {};
  EXPECT_TRUE(gate->Admit(host, 4096, unused));  // the first chunk is in
  copied = staging->CopyIn(&rt, 4096);
  ASSERT_TRUE(copied.ok() && !*copied);
  ASSERT_TRUE(second_chunk.HasBeenNotified());
  EXPECT_TRUE(woke_with.ok()) << woke_with;
  EXPECT_FALSE(client->done());  // the third chunk is still to come
  copied = staging->CopyIn(&rt, 4096);
  ASSERT_TRUE(copied.ok() && *copied);
  ASSERT_TRUE(client->WaitDone());
  EXPECT_TRUE(client->status().ok()) << client->status();
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(buf.view[i], static_cast<float>(i % 997)) << "element " << i;
  }
}

// A copy in that fails fails every step waiting for it and the operation's completion, and the
// result is not copied back.
TEST(DeviceStagingTest, AFailedPipelinedCopyFailsTheWaitingStepsAndTheCompletion) {
  device::FakeDeviceRuntime rt(1);
  FakeBuffer buf(&rt, 4096);
  for (size_t i = 0; i < 1024; ++i) buf.view[i] = 5.0f;
  auto client = std::make_shared<Recorder>();
  // 8192 bytes in place, of which the device has 4096: the second chunk's copy fails.
  PendingRequest p = AllReduceOn(&buf, &buf, 2048);
  p.session = client;
  Pipelined staged(&rt);
  ASSERT_TRUE(staged.Stage(&p, &rt));
  std::shared_ptr<HostStaging> staging = staged.staging;
  std::shared_ptr<scheduler::FillGate> gate = staged.gate;
  absl::Status woke_with;
  std::function<void(absl::Status)> wake = [&](absl::Status st) { woke_with = st; };
  ASSERT_FALSE(gate->Admit(p.req.send + 4096, 8, wake));
  p.session.lock()->PostCompletion(1, absl::OkStatus(), 0);
  absl::StatusOr<bool> copied = staging->CopyIn(&rt, 4096);
  ASSERT_TRUE(copied.ok() && !*copied) << copied.status();
  EXPECT_TRUE(woke_with.ok());  // not woken yet
  copied = staging->CopyIn(&rt, 4096);
  ASSERT_FALSE(copied.ok());
  EXPECT_EQ(woke_with.code(), absl::StatusCode::kInternal) << woke_with;
  ASSERT_TRUE(client->WaitDone());
  EXPECT_EQ(client->status().code(), absl::StatusCode::kInternal) << client->status();
  EXPECT_NE(client->status().message().find("copying device 0 memory to host memory"),
            std::string::npos)
      << client->status();
  // A step that comes after the failure is failed at once; one on filled bytes may still run.
  absl::Status late;
  std::function<void(absl::Status)> late_wake = [&](absl::Status st) { late = st; };
  EXPECT_FALSE(gate->Admit(p.req.send + 6000, 8, late_wake));
  EXPECT_EQ(late.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(gate->Admit(p.req.send, 4096, late_wake));
  for (size_t i = 0; i < 1024; ++i) ASSERT_EQ(buf.view[i], 5.0f) << "element " << i;
}

// Pipelined and watched by its run (OutputWatcher): the results go back as the run says it wrote
// them, only those bytes (a recv byte the run never wrote keeps the device's value, never a leased
// buffer's), and the completion waits for the copies back queued before it.
TEST(DeviceStagingTest, AWatchedRequestCopiesBackWhatTheRunWroteAsItWritesIt) {
  device::FakeDeviceRuntime rt(1);
  constexpr size_t kCount = 4096;  // 16 KiB: 4 chunks of 4096 bytes
  FakeBuffer send(&rt, kCount * 4), recv(&rt, kCount * 4);
  for (size_t i = 0; i < kCount; ++i) {
    send.view[i] = 1.0f;
    recv.view[i] = -7.0f;  // the device's values before the operation
  }
  auto client = std::make_shared<Recorder>();
  PendingRequest p = AllReduceOn(&send, &recv, kCount);
  p.request_id = 11;
  p.session = client;
  Pipelined staged(&rt);
  ASSERT_TRUE(staged.Stage(&p, &rt));
  ASSERT_NE(p.output_watcher, nullptr);
  p.output_watcher->Watched();  // what the communicator does before the run
  auto* host_recv = reinterpret_cast<float*>(p.req.recv);
  for (size_t i = 0; i < kCount; ++i) host_recv[i] = 99.0f;  // a leased buffer's old bytes
  // The run writes the first 3 KiB and the 3rd chunk, and says so; the device's thread is held so
  // that the copies back are still queued when the operation completes.
  absl::Notification go;
  staged.executor.PostToDevice(0, [&] { go.WaitForNotification(); });
  for (size_t i = 0; i < 768; ++i) host_recv[i] = 2.0f + static_cast<float>(i);
  p.output_watcher->Written(p.req.recv, 768 * 4);
  for (size_t i = 2048; i < 3072; ++i) host_recv[i] = 5.0f;
  p.output_watcher->Written(p.req.recv + 2048 * 4, 1024 * 4);
  p.output_watcher->Written(p.req.send, 64);  // not a recv region: nothing
  p.session.lock()->PostCompletion(11, absl::OkStatus(), 6);
  EXPECT_FALSE(client->done());  // its copies back are still queued
  go.Notify();
  ASSERT_TRUE(client->WaitDone());
  EXPECT_TRUE(client->status().ok()) << client->status();
  EXPECT_EQ(client->id(), 11u);
  for (size_t i = 0; i < kCount; ++i) {
    const float want = i < 768                 ? 2.0f + static_cast<float>(i)
                       : i >= 2048 && i < 3072 ? 5.0f
                                               : -7.0f;
    ASSERT_EQ(recv.view[i], want) << "element " << i;
  }
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(send.view[i], 1.0f) << "element " << i;
}

// What DaemonCore weighs against --staging_inline_bytes: the bytes the copy to host memory would
// take, without touching the device.
TEST(DeviceStagingTest, StagedBytesAreTheRegionsTheOperationTouches) {
  device::FakeDeviceRuntime rt(1);
  FakeBuffer send(&rt, 8192), recv(&rt, 8192);
  PendingRequest p = AllReduceOn(&send, &recv, 1000);
  EXPECT_EQ(StagedBytes(p, 2), 8000u);
  p.req.recv = p.req.send;  // in place: still both regions
  EXPECT_EQ(StagedBytes(p, 2), 8000u);
  PendingRequest r = AllReduceOn(&send, &recv, 1000);
  r.req.op = scheduler::OpKind::kReduce;
  r.req.root = 1;
  r.rank = 0;  // not the root: nothing to receive
  EXPECT_EQ(StagedBytes(r, 2), 4000u);
  r.rank = 1;
  EXPECT_EQ(StagedBytes(r, 2), 8000u);
  r.req.root = 5;  // refused by StageThroughHost, which says why
  EXPECT_EQ(StagedBytes(r, 2), 0u);
  PendingRequest g = AllReduceOn(&send, &recv, 500);
  g.req.op = scheduler::OpKind::kAllGather;  // 500 floats from each of 4 ranks
  EXPECT_EQ(StagedBytes(g, 4), 2000u + 8000u);
}

}  // namespace
}  // namespace railyard
