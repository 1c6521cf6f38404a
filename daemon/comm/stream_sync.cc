#include "daemon/comm/stream_sync.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/comm/pending_request.h"

namespace railyard {

namespace {
uint32_t* Word(const StreamSync& s, uint64_t at) {
  return reinterpret_cast<uint32_t*>(s.words->data() + s.offset + at);
}
}  // namespace

uint32_t StreamSync::ready_word() const {
  return __atomic_load_n(Word(*this, 0), __ATOMIC_ACQUIRE);
}

void StreamSync::SignalDone() const { __atomic_store_n(Word(*this, 4), value, __ATOMIC_RELEASE); }

std::string StreamSync::Where() const {
  return absl::StrCat("buffer ", buffer_id, " offset ", offset);
}

StreamSyncSink::StreamSyncSink(std::weak_ptr<CompletionSink> inner, StreamSync sync)
    : inner_(std::move(inner)), sync_(std::move(sync)) {}

StreamSyncSink::~StreamSyncSink() { Signal(); }

void StreamSyncSink::Signal() {
  if (!signalled_.exchange(true, std::memory_order_acq_rel)) sync_.SignalDone();
}

void StreamSyncSink::PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) {
  Signal();
  if (auto inner = inner_.lock()) inner->PostCompletion(request_id, status, seq);
}

void AttachStreamSync(PendingRequest* request) {
  if (!request->sync.has_value()) return;
  auto sink = std::make_shared<StreamSyncSink>(request->session, *request->sync);
  request->session = sink;
  request->sink_owner = std::move(sink);
}

}  // namespace railyard
