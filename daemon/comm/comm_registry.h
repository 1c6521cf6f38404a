// The communicators of a daemon, by (job, comm id): finding them, building each once while
// several local ranks' joins wait for it (without blocking a thread), retiring them when every
// local rank left, and the tag slots (daemon/scheduler/tags.h) their bootstraps hold. Thread-safe;
// never calls out (no callback, no communicator method) while holding its lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/comm/communicator.h"
#include "daemon/scheduler/tags.h"

namespace railyard {

class CommRegistry {
 public:
  using Key = std::pair<std::string, std::string>;  // (job, comm id)
  using BuiltFn = std::function<void(const absl::StatusOr<std::shared_ptr<Communicator>>&)>;

  explicit CommRegistry(int max_tag_slots = scheduler::tags::kMaxSlots);

  // The communicator of key in any state, or null.
  std::shared_ptr<Communicator> Find(const Key& key) const;

  enum class Claim {
    kFound,    // *comm is the live communicator of key
    kWaiting,  // another join is building it: `waiter` runs with the result of that build
    kBuild,    // the caller builds it, then calls Built()
  };
  // A failed communicator is never revived: it is forgotten here and a new one takes its id.
  Claim FindOrClaim(const Key& key, BuiltFn waiter, std::shared_ptr<Communicator>* comm);
  // The claimant's result: registered when OK (UNAVAILABLE instead once Close()d). Returns the
  // waiters, for the caller to run with `made` outside any lock.
  std::vector<BuiltFn> Built(const Key& key, absl::StatusOr<std::shared_ptr<Communicator>>& made);

  // Forgets comm if it is still key's communicator, counting its operations as retired.
  void Retire(const std::shared_ptr<Communicator>& comm);
  // Refuses every later registration; returns the communicators registered now.
  std::vector<std::shared_ptr<Communicator>> Close();
  std::vector<std::shared_ptr<Communicator>> Snapshot() const;
  // Operations of communicators already retired: (completed, failed).
  std::pair<uint64_t, uint64_t> retired_ops() const;

  // This daemon's tag slot for key's bootstrap, shared by its local ranks' joins (each holds a
  // reference until the layout arrives; the communicator holds it after that).
  // RESOURCE_EXHAUSTED when every slot is taken.
  absl::StatusOr<std::shared_ptr<const scheduler::tags::Slot>> BootstrapSlot(const Key& key);
  // The layout arrived (or the bootstrap failed): later joins of key get a new slot.
  void EndBootstrap(const Key& key);
  int tag_slots_in_use() const { return tag_slots_.in_use(); }

 private:
  scheduler::tags::TagSlotTable tag_slots_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<Key, std::shared_ptr<Communicator>> comms_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::vector<BuiltFn>> building_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::weak_ptr<const scheduler::tags::Slot>> bootstrap_slots_ ABSL_GUARDED_BY(mu_);
  uint64_t retired_completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t retired_failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace railyard
