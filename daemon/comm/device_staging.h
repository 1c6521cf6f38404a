// Device memory across nodes, staged through host memory: a request on device buffers of a
// multi-node communicator is pointed at host copies of its regions before the communicator sees
// it (so every inter-node algorithm, codec and check runs unchanged), and its results are copied
// back to the device before its completion reaches the client.
//
// The host copies are page-locked buffers leased from a StagingPool (daemon/device/staging_pool.h)
// and reused across operations. Not pipelined yet: the whole send region is copied to the host
// before the operation goes to its communicator (DaemonCore: on the submitting thread up to
// --staging_inline_bytes, past it on the device's thread, in the order the rank submitted), and
// the whole recv region back after it ends, on the device's thread (never a transport's progress
// thread).
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "daemon/comm/pending_request.h"
#include "daemon/device/device_runtime.h"
#include "daemon/device/staging_pool.h"
#include "daemon/scheduler/executor.h"

namespace railyard {

// For a request whose buffers are device memory (req.device >= 0): copies its send and recv
// regions (one region when they overlap: in place) into host memory leased from `pool`, the
// region's bytes charged to the session's buffer-bytes quota (RESOURCE_EXHAUSTED past it) until
// the copy back is done, points req at the copies (req.device -1), and
// makes request->session a sink that copies the recv region back, then completes to the old one.
// A failed copy is the request's error (INTERNAL naming it); the request is left as it was.
absl::Status StageThroughHost(PendingRequest* request, int nranks, device::DeviceRuntime* devices,
                              device::StagingPool* pool, scheduler::Executor* executor);

// The bytes StageThroughHost would copy for a request on device buffers (send and recv regions,
// counted apart even when they overlap); 0 for a request it would refuse (its error comes from
// StageThroughHost).
uint64_t StagedBytes(const PendingRequest& request, int nranks);

}  // namespace railyard
