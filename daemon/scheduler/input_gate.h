// Memory an operation's steps may touch only once it has been filled: device staging copies a
// rank's device memory into host memory chunk by chunk while the operation already runs
// (daemon/submit/device_staging.h), and each step that reads or writes those host bytes waits for
// them (NodeRun::Params::gates).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace railyard::scheduler {

// Byte runs as disjoint, non-touching [begin, end) keyed by begin: what has been written (device
// staging's copies back, FinalRecvWrites). AddRun adds [begin, end), merged with the runs it
// overlaps or touches, and returns the run it is now part of; Covers says whether one run holds
// all of [begin, end).
std::pair<uint64_t, uint64_t> AddRun(std::map<uint64_t, uint64_t>& runs, uint64_t begin,
                                     uint64_t end);
bool Covers(const std::map<uint64_t, uint64_t>& runs, uint64_t begin, uint64_t end);

class InputGate {
 public:
  virtual ~InputGate() = default;
  // True when [p, p + n) may be touched now (also when none of it is this gate's memory).
  // Otherwise false, and `wake` is moved from and runs once: on the thread that fills the
  // memory, OK once the range may be touched or the error that stopped the filling; or, when
  // the filling had stopped already, with its error before Admit returns.
  virtual bool Admit(const std::byte* p, uint64_t n, std::function<void(absl::Status)>& wake) = 0;
};

// The other direction: told as the run writes results, so that they can leave before the run
// ends (device staging copies them back to the device). Only final writes are told (the last
// step that writes each byte of a recv region), with the exact bytes each step wrote, after it
// has and before any step that depends on it starts.
class OutputWatcher {
 public:
  virtual ~OutputWatcher() = default;
  // A run will tell this watcher its writes (called before the run starts). A watcher never
  // told so sees no writes and must not wait for any.
  virtual void Watched() = 0;
  // [p, p + n) holds its final value (may be no memory of this watcher's: ignore it).
  virtual void Written(const std::byte* p, uint64_t n) = 0;
};

// Regions filled from their start, in order (region 0 first): what HostStaging copies in.
class FillGate : public InputGate {
 public:
  // Regions [begin, begin + bytes); none filled yet.
  struct Region {
    const std::byte* begin = nullptr;
    uint64_t bytes = 0;
  };
  explicit FillGate(std::vector<Region> regions);

  bool Admit(const std::byte* p, uint64_t n, std::function<void(absl::Status)>& wake) override;

  // Region `region` holds its first `filled` bytes (never less than before); the waiters whose
  // ranges are now filled run, on this thread.
  void Advance(size_t region, uint64_t filled);
  // Filling stopped: every waiter, now and later, gets `error` (not OK).
  void Fail(const absl::Status& error);
  // Runs `then` once every region is filled (OK) or the filling failed (its error): at once if
  // so already, else on the filling thread.
  void WhenFilled(std::function<void(absl::Status)> then);

 private:
  struct Waiter {
    const std::byte* p;
    uint64_t n;
    std::function<void(absl::Status)> wake;
  };
  bool FilledLocked(const std::byte* p, uint64_t n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllFilledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  const std::vector<Region> regions_;
  std::vector<uint64_t> filled_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(absl::Status)>> when_filled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard::scheduler
