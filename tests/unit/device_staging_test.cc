// Staging a device-memory request through host memory (daemon/comm/device_staging.h), on the fake
// device runtime: the request is pointed at host copies holding the device's data, the results
// go back to the device before the completion is forwarded, and a failed copy leaves the request
// as it was with an error naming it.
#include "daemon/comm/device_staging.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"
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

TEST(DeviceStagingTest, TheRequestRunsOnHostCopiesAndItsResultReachesTheDeviceFirst) {
  device::FakeDeviceRuntime rt(1);
  scheduler::Executor executor(1);
  constexpr size_t kCount = 1000;
  FakeBuffer send(&rt, kCount * 4), recv(&rt, kCount * 4);
  for (size_t i = 0; i < kCount; ++i) {
    send.view[i] = static_cast<float>(i);
    recv.view[i] = -1.0f;
  }
  auto client = std::make_shared<Recorder>();
  PendingRequest p;
  p.request_id = 7;
  p.session = client;
  p.req.op = scheduler::OpKind::kAllReduce;
  p.req.count = kCount;
  p.req.send = send.segment->data();
  p.req.recv = recv.segment->data();
  p.req.device = 0;
  p.send_segment = send.segment;
  p.recv_segment = recv.segment;
  ASSERT_TRUE(StageThroughHost(&p, 2, &rt, &executor).ok());
  EXPECT_EQ(p.req.device, -1);
  // Host memory now, holding what the device held (this read would fault on device addresses).
  const auto* staged_send = reinterpret_cast<const float*>(p.req.send);
  EXPECT_EQ(staged_send[999], 999.0f);
  auto* staged_recv = reinterpret_cast<float*>(p.req.recv);
  EXPECT_EQ(staged_recv[0], -1.0f);
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

TEST(DeviceStagingTest, AFailedCopyLeavesTheRequestAsItWas) {
  device::FakeDeviceRuntime rt(1);
  scheduler::Executor executor(1);
  FakeBuffer send(&rt, 4096);
  PendingRequest p;
  p.req.op = scheduler::OpKind::kAllReduce;
  p.req.count = 2048;  // 8192 bytes: past the 4096-byte mapping
  p.req.send = send.segment->data();
  p.req.recv = send.segment->data();
  p.req.device = 0;
  absl::Status s = StageThroughHost(&p, 2, &rt, &executor);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("copying device 0 memory to host memory before the operation"),
            std::string::npos)
      << s;
  EXPECT_EQ(p.req.device, 0);
  EXPECT_EQ(p.req.send, send.segment->data());
  EXPECT_EQ(p.sink_owner, nullptr);
}

}  // namespace
}  // namespace railyard
