// Test helpers for device memory on hosts without a GPU: a fake device allocation as the
// daemon's --fake_gpus runtime imports it (daemon/device/fake_device_runtime.h), and a fake stream
// (railyard/stream_ops.h) that runs its work in order on a thread of its own, as a CUDA stream
// runs kernels and memory operations in order on the device.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "railyard/stream_ops.h"

namespace railyard::testing {

// A fake device allocation: the client's view of it (what cudaMemcpy would read and write).
struct FakeDeviceMemory {
  FakeDeviceMemory(int device, size_t bytes) : bytes(bytes) {
    const std::string name = "railyard-fake-device-" + std::to_string(device);
    fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    view = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ~FakeDeviceMemory() {
    ::munmap(view, bytes);
    ::close(fd);
  }
  float* f() const { return static_cast<float*>(view); }
  int fd = -1;
  void* view = nullptr;
  size_t bytes;
};

// A stream: work enqueued on it runs in order, one item after the other, on its own thread.
class FakeStream {
 public:
  FakeStream() : thread_([this] { Run(); }) {}
  ~FakeStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Enqueue(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
    }
    cv_.notify_all();
  }
  // Waits until everything enqueued so far has run (cudaStreamSynchronize); false after `limit`.
  bool Synchronize(std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return idle_cv_.wait_for(lock, limit, [this] { return queue_.empty() && !running_; });
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      work();
      lock.lock();
      running_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;
  bool stop_ = false;
  std::thread thread_;
};

// StreamOps over FakeStreams (a stream is a FakeStream*): host words are their own addresses; a
// wait polls the word (giving up, and failing the test, after 30 s).
class FakeStreamOps : public StreamOps {
 public:
  absl::StatusOr<uint64_t> MapHostWords(void* p, size_t) override {
    ++mapped;
    return reinterpret_cast<uint64_t>(p);
  }
  void UnmapHostWords(void*) override { --mapped; }
  absl::Status WriteValue(void* stream, uint64_t addr, uint32_t value) override {
    static_cast<FakeStream*>(stream)->Enqueue([addr, value] {
      __atomic_store_n(reinterpret_cast<uint32_t*>(addr), value, __ATOMIC_RELEASE);
    });
    return absl::OkStatus();
  }
  absl::Status WaitValue(void* stream, uint64_t addr, uint32_t value) override {
    static_cast<FakeStream*>(stream)->Enqueue([addr, value] {
      const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (static_cast<int32_t>(
                 __atomic_load_n(reinterpret_cast<uint32_t*>(addr), __ATOMIC_ACQUIRE) - value) <
             0) {
        if (std::chrono::steady_clock::now() > limit) {
          ADD_FAILURE() << "a stream waited 30 s for done word value " << value;
          return;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
    return absl::OkStatus();
  }
  std::atomic<int> mapped{0};
};

}  // namespace railyard::testing
