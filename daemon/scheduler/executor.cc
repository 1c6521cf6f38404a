#include "daemon/scheduler/executor.h"

#include <string>
#include <utility>

#include "daemon/util/thread_name.h"

namespace railyard::scheduler {

Executor::Executor(int threads) {
  if (threads < 1) threads = 1;
  workers_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i)
    workers_.emplace_back([this] {
      NameDataPlaneThread("ry-worker");
      WorkerLoop();
    });
}

Executor::~Executor() {
  // Device threads first: what they run may post to the workers.
  for (auto& lane : lanes_) {
    {
      absl::MutexLock lock(&lane->mu);
      lane->stopping = true;
    }
    lane->thread.join();
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : workers_) t.join();
}

void Executor::SetDeviceRuntime(device::DeviceRuntime* devices) {
  devices_ = devices;
  const int count = devices == nullptr ? 0 : devices->DeviceCount();
  for (int d = static_cast<int>(lanes_.size()); d < count; ++d) {
    auto lane = std::make_unique<DeviceLane>();
    DeviceLane* raw = lane.get();
    lane->thread = std::thread([raw, d] {
      NameDataPlaneThread(("ry-device" + std::to_string(d)).c_str());
      LaneLoop(raw);
    });
    lanes_.push_back(std::move(lane));
  }
}

void Executor::LaneLoop(DeviceLane* lane) {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&lane->mu);
      lane->mu.Await(absl::Condition(
          +[](DeviceLane* l)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->mu) { return l->stopping || !l->tasks.empty(); },
          lane));
      if (lane->tasks.empty()) return;  // stopping and drained
      task = std::move(lane->tasks.front());
      lane->tasks.pop_front();
    }
    task();
  }
}

void Executor::PostToDevice(int device, std::function<void()> fn) {
  if (device < 0 || device >= static_cast<int>(lanes_.size())) {
    Post(std::move(fn));
    return;
  }
  DeviceLane& lane = *lanes_[static_cast<size_t>(device)];
  absl::MutexLock lock(&lane.mu);
  lane.tasks.push_back(std::move(fn));
}

void Executor::RunOnDevice(Execution* exec) {
  PostToDevice(exec->plan.device, [this, exec] {
    exec->status = devices_ == nullptr
                       ? absl::FailedPreconditionError(
                             "device memory reached an executor without a device runtime")
                       : RunDeviceSteps(exec->plan, devices_);
    exec->on_done();
  });
}

void Executor::Run(Execution* exec) {
  exec->status = absl::OkStatus();
  const size_t nsteps = exec->plan.steps.size();
  if (nsteps > 0 && exec->plan.device >= 0) {
    RunOnDevice(exec);
    return;
  }
  if (nsteps == 0) {
    exec->on_done();
    return;
  }
  exec->next_step = 0;
  exec->remaining.store(nsteps, std::memory_order_relaxed);
  exec->next_in_queue = nullptr;
  absl::MutexLock lock(&mu_);
  if (tail_ == nullptr) {
    head_ = tail_ = exec;
  } else {
    tail_->next_in_queue = exec;
    tail_ = exec;
  }
}

namespace {
thread_local int inline_depth = 0;
}  // namespace

void Executor::RunInlineOrQueue(Execution* exec, size_t max_bytes) {
  exec->status = absl::OkStatus();
  if (exec->plan.device >= 0 && !exec->plan.steps.empty()) {
    // Never on the submitting thread (a session's ring thread): it would wait for the GPU.
    RunOnDevice(exec);
    return;
  }
  auto run_in_order = [](Execution* e) {
    ++inline_depth;
    const size_t nsteps = e->plan.steps.size();
    for (size_t i = 0; i < nsteps; ++i) RunStep(e->plan, i);
    e->on_done();
    --inline_depth;
  };
  if (inline_depth == 0 && exec->plan.bytes_moved <= max_bytes) {
    run_in_order(exec);
  } else if (exec->sequential) {
    Post([exec, run_in_order] { run_in_order(exec); });
  } else {
    Run(exec);
  }
}

void Executor::Post(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(fn));
}

void Executor::WorkerLoop() {
  for (;;) {
    Execution* exec = nullptr;
    size_t step = 0;
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return head_ != nullptr || !tasks_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&has_work));
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      } else if (head_ == nullptr) {
        return;  // stopping and drained
      }
      if (!task) {
        exec = head_;
        step = exec->next_step++;
        if (exec->next_step == exec->plan.steps.size()) {
          // Last step handed out: the next worker starts on the next operation.
          head_ = exec->next_in_queue;
          if (head_ == nullptr) tail_ = nullptr;
        }
      }
    }
    if (task) {
      task();
      continue;
    }
    RunStep(exec->plan, step);
    if (exec->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) exec->on_done();
  }
}

}  // namespace railyard::scheduler
