// Stream ordering (SubmitRequest.stream_sync, docs/gpu.md "Stream ordering"): two u32 words in a
// host buffer of the submitting session. The operation starts once "ready" has reached the value
// (the client's CUDA stream wrote it there, cuStreamWriteValue32); the daemon stores the value
// into "done" when the operation has ended, whatever its outcome, and the client's stream, waiting
// on it (cuStreamWaitValue32), goes on. The words are the client's memory: the daemon only reads
// ready and writes done, never trusts what ready holds beyond comparing it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "daemon/session/completion_sink.h"
#include "daemon/session/shm_segment.h"

namespace railyard {

struct PendingRequest;

struct StreamSync {
  std::shared_ptr<MappedSegment> words;  // host memory; offset + 8 <= size, offset % 4 == 0
  uint64_t buffer_id = 0;                // the client's name for it, for messages
  uint64_t offset = 0;
  uint32_t value = 0;

  uint32_t ready_word() const;
  // ready has reached value, as CU_STREAM_WAIT_VALUE_GEQ compares: (int32)(ready - value) >= 0,
  // so a counter that wraps keeps working.
  bool ready() const { return static_cast<int32_t>(ready_word() - value) >= 0; }
  // Stores value into done (release: what the operation wrote is visible first).
  void SignalDone() const;
  // "buffer B offset O" for messages.
  std::string Where() const;
};

// Wraps the request's completion sink: the first completion (or, when none comes because the
// request was refused or dropped, the sink's destruction) stores the value into done, then the
// completion goes on. Owned by the request (PendingRequest::sink_owner).
class StreamSyncSink : public CompletionSink {
 public:
  StreamSyncSink(std::weak_ptr<CompletionSink> inner, StreamSync sync);
  ~StreamSyncSink() override;
  void PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) override;

 private:
  void Signal();
  const std::weak_ptr<CompletionSink> inner_;
  const StreamSync sync_;
  std::atomic<bool> signalled_{false};
};

// Puts a StreamSyncSink in front of request->session when the request has a stream_sync. Call it
// before anything else wraps the sink (device staging), so that done is stored only after the
// results are in place.
void AttachStreamSync(PendingRequest* request);

}  // namespace railyard
