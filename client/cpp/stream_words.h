// The ready/done words of the streams a Client orders operations on (CollectiveOptions::stream,
// railyard/stream_ops.h): one host buffer shared with the daemon, 8 bytes per stream, each
// stream's values counting up from 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "railyard/stream_ops.h"

namespace railyard::internal {

// Stores value into *word unless the word already holds it or a later one ((int32_t)(word -
// value) >= 0): a stream's done word only moves forward, whoever stores into it, in any order.
void StoreAtLeast(uint32_t* word, uint32_t value);

class StreamWords {
 public:
  static constexpr size_t kBytes = 4096;  // 512 streams
  using RegisterFn = std::function<absl::StatusOr<uint64_t>(int memfd, uint64_t size)>;
  using ReleaseFn = std::function<void(uint64_t buffer_id)>;
  // Allocates the buffer, registers it with the daemon (register_buffer) and maps it for streams
  // (release_buffer undoes the registration when that fails).
  static absl::StatusOr<std::unique_ptr<StreamWords>> Create(std::shared_ptr<StreamOps> ops,
                                                             const std::string& job,
                                                             const RegisterFn& register_buffer,
                                                             const ReleaseFn& release_buffer);
  // Unmaps it (the daemon's registration ends with the session).
  ~StreamWords();
  StreamWords(const StreamWords&) = delete;
  StreamWords& operator=(const StreamWords&) = delete;

  struct Slot {
    uint64_t buffer_id = 0;
    uint64_t offset = 0;
    uint32_t value = 0;
    uint32_t* done = nullptr;  // this process's view of the done word
  };
  // Takes `stream`'s next value and enqueues on it the store of ready and the wait for done (in
  // one step, so that two threads sharing a stream enqueue their values in order).
  absl::StatusOr<Slot> Enqueue(void* stream);

 private:
  StreamWords() = default;
  std::shared_ptr<StreamOps> ops_;
  void* data_ = nullptr;
  uint64_t mapped_ = 0;  // the streams' address of data_
  uint64_t buffer_id_ = 0;
  std::mutex mu_;
  struct Stream {
    size_t index = 0;
    uint32_t last = 0;
  };
  std::map<void*, Stream> streams_;
};

}  // namespace railyard::internal
