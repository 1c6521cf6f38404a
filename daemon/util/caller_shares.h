// A shared pool's units counted by caller (a uid, a job, a session): each caller may hold up to
// its share, all callers together up to the pool's backstop. A caller at its share is refused
// while everyone else is still served; the backstop only bounds the total. No lock of its own:
// the pool's owner holds its lock around every call.
#pragma once

#include <cstddef>
#include <map>

namespace railyard {

template <typename Key>
class CallerShares {
 public:
  enum class Refusal { kNone, kCallerShare, kPool };

  // per_caller 0: no share (the pool's limit alone); total 0: no backstop.
  CallerShares(size_t total, size_t per_caller) : total_limit_(total), share_(per_caller) {}

  // Counts one unit for caller, or says why not (and counts nothing).
  Refusal Take(const Key& caller) {
    if (total_limit_ != 0 && total_ >= total_limit_) return Refusal::kPool;
    size_t& held = held_[caller];
    if (share_ != 0 && held >= share_) return Refusal::kCallerShare;
    ++held;
    ++total_;
    return Refusal::kNone;
  }
  // Gives back one unit Take counted for caller.
  void Give(const Key& caller) {
    auto it = held_.find(caller);
    if (it == held_.end() || it->second == 0) return;
    --total_;
    if (--it->second == 0) held_.erase(it);
  }

  size_t of(const Key& caller) const {
    auto it = held_.find(caller);
    return it == held_.end() ? 0 : it->second;
  }
  size_t total() const { return total_; }
  size_t callers() const { return held_.size(); }
  size_t share() const { return share_; }
  size_t total_limit() const { return total_limit_; }

 private:
  const size_t total_limit_;
  const size_t share_;
  size_t total_ = 0;
  std::map<Key, size_t> held_;  // only callers holding something
};

}  // namespace railyard
