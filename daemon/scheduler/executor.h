// Runs local plans on a fixed pool of worker threads. Workers sleep on a condition variable when
// there is no work (no CPU when idle) and help each other on the steps of one large operation.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/device/device_runtime.h"
#include "daemon/scheduler/local_plan.h"

namespace railyard::scheduler {

// One operation's run. Owned and reused by its caller (a communicator keeps one per ordered
// channel), so the data path allocates nothing.
struct Execution {
  LocalPlan plan;
  // Called once, from the thread that finished the last step, after every step has run.
  std::function<void()> on_done;

  // Run its steps one after the other on one thread (a fused group: its operations keep their
  // order), not spread over the workers.
  bool sequential = false;

  // How the steps went, for on_done to read: not OK only for a device plan whose launches or
  // stream failed (host steps cannot fail).
  absl::Status status;

  // Executor state.
  size_t next_step = 0;
  std::atomic<size_t> remaining{0};
  Execution* next_in_queue = nullptr;
};

class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();  // drains queued work, then joins
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs exec->plan's steps on the workers, then exec->on_done(). A plan without steps completes
  // inline, on the calling thread. exec must stay alive and untouched until on_done runs.
  void Run(Execution* exec);

  // Runs exec like Run, but on the calling thread when the plan moves at most max_bytes and the
  // thread is not already inside an inline run (which bounds the recursion of an on_done that
  // starts the next operation): a small operation costs no wake-up of a worker.
  void RunInlineOrQueue(Execution* exec, size_t max_bytes);

  // Runs fn once on a worker (the multi-node executor's local steps).
  void Post(std::function<void()> fn);

  // Where device plans (plan.device >= 0) run: all their steps enqueued in order on the devices'
  // streams by a thread of the plan's first device (one per device, started here), which then
  // waits for the streams, so that waiting for a GPU never holds a worker the host plans of
  // other jobs need. Set once, before any such plan is run; without it they fail with
  // FAILED_PRECONDITION. Not owned.
  void SetDeviceRuntime(device::DeviceRuntime* devices);
  // Runs fn once on `device`'s thread (after the device work queued there before it); on a worker
  // when there is no such device thread.
  void PostToDevice(int device, std::function<void()> fn);

  int threads() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop();
  // Runs a device plan on its device's thread, then its on_done.
  void RunOnDevice(Execution* exec);

  // One thread per device, running what is posted to it in order.
  struct DeviceLane {
    absl::Mutex mu;
    std::deque<std::function<void()>> tasks ABSL_GUARDED_BY(mu);
    bool stopping ABSL_GUARDED_BY(mu) = false;
    std::thread thread;
  };
  static void LaneLoop(DeviceLane* lane);

  device::DeviceRuntime* devices_ = nullptr;
  std::vector<std::unique_ptr<DeviceLane>> lanes_;  // by device ordinal; set once

  absl::Mutex mu_;
  Execution* head_ ABSL_GUARDED_BY(mu_) = nullptr;
  Execution* tail_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace railyard::scheduler
