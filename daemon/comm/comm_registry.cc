#include "daemon/comm/comm_registry.h"

namespace railyard {

CommRegistry::CommRegistry(int max_tag_slots) : tag_slots_(max_tag_slots) {}

std::shared_ptr<Communicator> CommRegistry::Find(const Key& key) const {
  absl::MutexLock lock(&mu_);
  auto it = comms_.find(key);
  return it == comms_.end() ? nullptr : it->second;
}

CommRegistry::Claim CommRegistry::FindOrClaim(const Key& key, BuiltFn waiter,
                                              std::shared_ptr<Communicator>* comm) {
  absl::MutexLock lock(&mu_);
  auto it = comms_.find(key);
  if (it != comms_.end() && it->second->failed()) {
    comms_.erase(it);
    it = comms_.end();
  }
  if (it != comms_.end()) {
    *comm = it->second;
    return Claim::kFound;
  }
  if (auto b = building_.find(key); b != building_.end()) {
    b->second.push_back(std::move(waiter));
    return Claim::kWaiting;
  }
  building_[key];
  return Claim::kBuild;
}

std::vector<CommRegistry::BuiltFn> CommRegistry::Built(
    const Key& key, absl::StatusOr<std::shared_ptr<Communicator>>& made) {
  absl::MutexLock lock(&mu_);
  if (made.ok() && closed_) made = absl::UnavailableError("railyardd is shutting down");
  if (made.ok()) comms_[key] = *made;
  std::vector<BuiltFn> waiters;
  if (auto b = building_.find(key); b != building_.end()) {
    waiters = std::move(b->second);
    building_.erase(b);
  }
  return waiters;
}

void CommRegistry::Retire(const std::shared_ptr<Communicator>& comm) {
  const CommStats stats = comm->Stats();  // outside the lock: it takes the comm's
  absl::MutexLock lock(&mu_);
  auto it = comms_.find({comm->job(), comm->comm_id()});
  if (it == comms_.end() || it->second != comm) return;
  retired_completed_ += stats.ops_completed;
  retired_failed_ += stats.ops_failed;
  comms_.erase(it);
}

std::vector<std::shared_ptr<Communicator>> CommRegistry::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  std::vector<std::shared_ptr<Communicator>> out;
  for (const auto& [key, c] : comms_) out.push_back(c);
  return out;
}

std::vector<std::shared_ptr<Communicator>> CommRegistry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Communicator>> out;
  for (const auto& [key, c] : comms_) out.push_back(c);
  return out;
}

std::pair<uint64_t, uint64_t> CommRegistry::retired_ops() const {
  absl::MutexLock lock(&mu_);
  return {retired_completed_, retired_failed_};
}

absl::StatusOr<std::shared_ptr<const scheduler::tags::Slot>> CommRegistry::BootstrapSlot(
    const Key& key) {
  absl::MutexLock lock(&mu_);
  std::weak_ptr<const scheduler::tags::Slot>& shared = bootstrap_slots_[key];
  if (std::shared_ptr<const scheduler::tags::Slot> slot = shared.lock()) return slot;
  absl::StatusOr<std::shared_ptr<const scheduler::tags::Slot>> got = tag_slots_.Acquire();
  if (!got.ok()) {
    bootstrap_slots_.erase(key);
    return got.status();
  }
  shared = *got;
  // Forget the bootstraps whose joins all failed (their slots are back in the table).
  for (auto it = bootstrap_slots_.begin(); it != bootstrap_slots_.end();) {
    it = it->second.expired() ? bootstrap_slots_.erase(it) : std::next(it);
  }
  return got;
}

void CommRegistry::EndBootstrap(const Key& key) {
  absl::MutexLock lock(&mu_);
  bootstrap_slots_.erase(key);
}

}  // namespace railyard
