// Stream ordering (docs/gpu.md, "Stream ordering"): how a Client puts its operations in order on
// an accelerator's stream, as NCCL users expect. For an operation given a stream
// (CollectiveOptions::stream) the client enqueues on it a store of a "ready" word and, after it,
// a wait for a "done" word, both in host memory shared with the daemon; the daemon starts the
// operation once ready holds the operation's value and stores the value into done when it has
// ended. Work the stream ran before the call is therefore done before the operation reads its
// buffers, and work enqueued after the call waits for the operation's results, without
// Work::wait() (which still reports the outcome).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace railyard {

class StreamOps {
 public:
  virtual ~StreamOps() = default;
  // Makes the host memory [p, p + bytes) storable and waitable from streams; returns the address
  // streams use for p. The memory stays mapped until UnmapHostWords(p).
  virtual absl::StatusOr<uint64_t> MapHostWords(void* p, size_t bytes) = 0;
  virtual void UnmapHostWords(void* p) = 0;
  // Enqueue on `stream`: store `value` at `addr` (a mapped address), after what is before it.
  virtual absl::Status WriteValue(void* stream, uint64_t addr, uint32_t value) = 0;
  // Enqueue on `stream`: nothing after it runs until (int32_t)(*addr - value) >= 0.
  virtual absl::Status WaitValue(void* stream, uint64_t addr, uint32_t value) = 0;
};

// CUDA's (a stream is a CUstream / cudaStream_t): cuMemHostRegister with DEVICEMAP,
// cuStreamWriteValue32 and cuStreamWaitValue32 (CU_STREAM_WAIT_VALUE_GEQ). FAILED_PRECONDITION
// when this build has no CUDA or this node no usable driver.
absl::StatusOr<std::shared_ptr<StreamOps>> CudaStreamOps();

}  // namespace railyard
