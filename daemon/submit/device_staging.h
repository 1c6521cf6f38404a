// Device memory across nodes, staged through host memory: a request on device buffers of a
// multi-node communicator is pointed at host copies of its regions before the communicator sees
// it (so every inter-node algorithm, codec and check runs unchanged), and its results are copied
// back to the device before its completion reaches the client.
//
// The host copies are page-locked buffers leased from a StagingPool (daemon/device/staging_pool.h)
// and reused across operations. Up to --staging_inline_bytes the whole send region is copied to
// the host on the submitting thread before the operation goes to its communicator. Past it
// (DaemonCore), on the device's thread a chunk (--staging_chunk_bytes, kStagingCopyChunk) per
// task, so the other work queued for that device (other tenants' operations) runs in between;
// a collective then goes to its communicator as soon as its host memory is leased, pipelined
// with the copies: its steps wait for the bytes they touch (Gate(), scheduler::InputGate), so its
// first chunks are on the wire while later ones are still being copied; and its results go back
// as its run writes them (scheduler::OutputWatcher: only the bytes it wrote), the completion
// after the last. Send/Recv wait for the whole copy, and their results go back after they end.
// Copies back run on the device's thread, never on a transport's progress thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/comm/pending_request.h"
#include "daemon/device/device_runtime.h"
#include "daemon/device/staging_pool.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/input_gate.h"
#include "daemon/session/quota.h"

namespace railyard {

// The most a staging copy on a device's thread moves in one task before it lets the device's
// other queued work run, by default (--staging_chunk_bytes; 4 MiB: ~0.2 ms over PCIe, ~1.3 ms for
// the fake's memcpy here).
inline constexpr uint64_t kStagingCopyChunk = uint64_t{4} << 20;

// One request's host copies, from Prepare to Attach.
class HostStaging {
 public:
  struct Region {
    std::byte* device_ptr = nullptr;
    uint64_t bytes = 0;
    device::StagingPool::Lease host;  // its first `bytes` bytes
    bool copy_in = false;             // holds the send region, or bytes the operation may not write
    bool copy_back = false;           // holds (part of) the recv region
  };

  // The regions of a request on device buffers (req.device >= 0: its send and recv regions, one
  // region when they overlap: in place), their bytes charged to the session's buffer-bytes quota
  // (RESOURCE_EXHAUSTED past it) until the copy back is done, and host memory leased from `pool`
  // for them. Nothing is copied yet and the request is not changed.
  static absl::StatusOr<std::unique_ptr<HostStaging>> Prepare(const PendingRequest& request,
                                                              int nranks,
                                                              device::StagingPool* pool);

  // The host memory still to be copied in, as a gate an operation's steps wait on
  // (scheduler::InputGate): CopyIn fills it, and fails it when a copy fails. Made on the first
  // call, which must come before the first CopyIn.
  std::shared_ptr<scheduler::FillGate> Gate();

  // Copies at most max_bytes more of what must go to host memory, in order; true once all of it
  // has. A failed copy: INTERNAL naming it.
  absl::StatusOr<bool> CopyIn(device::DeviceRuntime* devices, uint64_t max_bytes);

  // Points the request at the host copies (req.device -1) and makes request->session a sink that
  // copies the recv region back on the device's thread (chunk_bytes per task), then completes to
  // the old one. After CopyIn returned true, or, with a Gate(), before (the request then carries
  // the gate, and the copy back waits until everything was copied in). The sink keeps `staging`
  // (its host memory and quota charge) until its copy back is done; so does a copy in that
  // still runs.
  static void Attach(std::shared_ptr<HostStaging> staging, PendingRequest* request,
                     device::DeviceRuntime* devices, scheduler::Executor* executor,
                     uint64_t chunk_bytes = kStagingCopyChunk);

  int device() const { return device_; }
  const std::vector<Region>& regions() const { return regions_; }

 private:
  HostStaging() = default;
  int device_ = -1;
  bool has_send_ = false;  // the request's send (recv) region has bytes to stage
  bool has_recv_ = false;
  std::vector<Region> regions_;
  QuotaCharge charge_;
  size_t next_region_ = 0;  // CopyIn's place
  uint64_t next_offset_ = 0;
  std::shared_ptr<scheduler::FillGate> gate_;
  std::vector<size_t> gate_region_;  // by region: its index in gate_ (copy_in regions only)
};

// Prepare, CopyIn and Attach on the calling thread. A failed copy is the request's error
// (INTERNAL naming it); the request is then left as it was.
absl::Status StageThroughHost(PendingRequest* request, int nranks, device::DeviceRuntime* devices,
                              device::StagingPool* pool, scheduler::Executor* executor,
                              uint64_t chunk_bytes = kStagingCopyChunk);

// The bytes StageThroughHost would copy for a request on device buffers (send and recv regions,
// counted apart even when they overlap); 0 for a request it would refuse (its error comes from
// StageThroughHost).
uint64_t StagedBytes(const PendingRequest& request, int nranks);

}  // namespace railyard
