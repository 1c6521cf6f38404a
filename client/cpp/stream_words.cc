#include "stream_words.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "memfd_buffer.h"

namespace railyard::internal {

void StoreAtLeast(uint32_t* word, uint32_t value) {
  uint32_t cur = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  while (
      static_cast<int32_t>(cur - value) < 0 &&
      !__atomic_compare_exchange_n(word, &cur, value, false, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {
  }
}

absl::StatusOr<std::unique_ptr<StreamWords>> StreamWords::Create(std::shared_ptr<StreamOps> ops,
                                                                 const std::string& job,
                                                                 const RegisterFn& register_buffer,
                                                                 const ReleaseFn& release_buffer) {
  std::unique_ptr<StreamWords> w(new StreamWords());
  w->ops_ = std::move(ops);
  absl::StatusOr<MemfdBuffer> mem = CreateMemfdBuffer(job, kBytes);
  if (!mem.ok()) return mem.status();
  absl::StatusOr<uint64_t> id = register_buffer(mem->fd, kBytes);
  CloseMemfd(&*mem);
  if (!id.ok()) {
    UnmapBuffer(mem->data, mem->size);
    return absl::Status(id.status().code(), absl::StrCat("registering the streams' ready/done "
                                                         "words: ",
                                                         id.status().message()));
  }
  absl::StatusOr<uint64_t> mapped = w->ops_->MapHostWords(mem->data, kBytes);
  if (!mapped.ok()) {
    release_buffer(*id);
    UnmapBuffer(mem->data, mem->size);
    return absl::Status(mapped.status().code(),
                        absl::StrCat("mapping the streams' ready/done words for streams: ",
                                     mapped.status().message()));
  }
  w->data_ = mem->data;
  w->mapped_ = *mapped;
  w->buffer_id_ = *id;
  return w;
}

StreamWords::~StreamWords() {
  // The daemon's registration goes with the session.
  ops_->UnmapHostWords(data_);
  UnmapBuffer(data_, kBytes);
}

absl::StatusOr<StreamWords::Slot> StreamWords::Enqueue(void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) {
    if (streams_.size() >= kBytes / 8) {
      return absl::ResourceExhaustedError(absl::StrCat("this client already orders operations on ",
                                                       streams_.size(), " streams (the most)"));
    }
    it = streams_.emplace(stream, Stream{streams_.size(), 0}).first;
  }
  Stream& s = it->second;
  const uint32_t value = s.last + 1;  // wraps: compared as (int32_t)(word - value)
  const uint64_t offset = s.index * 8;
  if (absl::Status st = ops_->WriteValue(stream, mapped_ + offset, value); !st.ok()) return st;
  if (absl::Status st = ops_->WaitValue(stream, mapped_ + offset + 4, value); !st.ok()) {
    // The store of ready is enqueued; the daemon will see it with no operation to start: let the
    // stream's next value go on from here.
    s.last = value;
    return st;
  }
  s.last = value;
  Slot slot;
  slot.buffer_id = buffer_id_;
  slot.offset = offset;
  slot.value = value;
  slot.done = reinterpret_cast<uint32_t*>(static_cast<std::byte*>(data_) + offset + 4);
  return slot;
}

}  // namespace railyard::internal
