// A DeviceRuntime with no GPU, for testing what surrounds device memory (registration, its
// checks, release with the session, one-node steps over device buffers) on hosts without one.
//
// Allocate() stands for a client's cuMemCreate + cuMemExportToShareableHandle: it returns a memfd
// named kFakeDeviceMemfdPrefix + the device ordinal, the fake's "device allocation", which any
// process can make (a test's client does, in another process than the daemon's --fake_gpus).
// Import() accepts only such descriptors, as large as the size registered, and maps them twice:
// once where the fake's own kernels (the CPU ones) work, and once as the "device address" it hands
// out, a PROT_NONE reservation, so that host code that dereferences a device pointer faults at once
// instead of passing a test. Every step checks that its pointers lie in memory imported on its
// device or on a peer it can access.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/device/device_runtime.h"

namespace railyard::device {

inline constexpr char kFakeDeviceMemfdPrefix[] = "railyard-fake-device-";

class FakeDeviceRuntime : public DeviceRuntime {
 public:
  // peer_access: whether every device reaches every other's memory (as NVLink-connected GPUs
  // do); false: each only its own.
  explicit FakeDeviceRuntime(int devices, bool peer_access = true);
  ~FakeDeviceRuntime() override;

  // A new zeroed allocation of `bytes` on `device`, exported as a descriptor (a memfd: mmap it to
  // see what the daemon's steps wrote). Needs no runtime: what a client would call.
  static absl::StatusOr<UniqueFd> Allocate(int device, uint64_t bytes);

  int DeviceCount() const override { return devices_; }
  std::string Describe() const override;
  int DeviceOf(const void* ptr) const override;
  bool CanAccessPeer(int from, int to) const override {
    return from >= 0 && to >= 0 && from < devices_ && to < devices_ && (from == to || peer_access_);
  }
  absl::StatusOr<std::shared_ptr<DeviceMapping>> Import(int device, UniqueFd fd,
                                                        uint64_t size) override;
  // Stands for a client's cudaIpcGetMemHandle on an allocation from Allocate (fd, still open in
  // the calling process): a handle naming this process and the descriptor, which ImportIpc
  // opens through /proc/<pid>/fd/<fd>. As with CUDA's legacy IPC, the importer must see the
  // maker's process (a pod with hostIPC/hostPID); unlike CUDA's, the handle says which process
  // made it, and ImportIpc refuses it from any other.
  static absl::StatusOr<std::string> ExportIpc(int fd);
  absl::StatusOr<std::shared_ptr<DeviceMapping>> ImportIpc(int device, std::string_view handle,
                                                           uint64_t offset, uint64_t size,
                                                           int64_t client_pid) override;
  absl::Status ReduceToMany(int device, kernels::DataType dtype, kernels::RedOp op,
                            void* const* dsts, int ndsts, const void* const* srcs, int nsrcs,
                            size_t count, uint32_t avg_divisor) override;
  absl::Status Copy(int device, void* dst, const void* src, size_t bytes) override;
  absl::Status Swap(int device, void* a, void* b, size_t bytes) override;
  absl::Status CopyToHost(int device, void* host_dst, const void* device_src,
                          size_t bytes) override;
  absl::Status CopyFromHost(int device, void* device_dst, const void* host_src,
                            size_t bytes) override;
  // Anonymous memory with every page faulted in at once (MAP_POPULATE), as page-locking does.
  absl::StatusOr<std::unique_ptr<PinnedHostMemory>> AllocatePinned(size_t bytes) override;
  absl::Status Synchronize(int device) override;

  // Steps run (reduce, copy, swap) and mappings alive, for tests.
  uint64_t steps() const { return steps_.load(); }
  // Pinned allocations made, for tests.
  uint64_t pinned_allocations() const { return pinned_allocations_.load(); }
  size_t live_mappings() const;

 private:
  class Mapping;
  struct Region {
    std::byte* host;  // where the CPU kernels read and write
    uint64_t bytes;
    int device;
  };
  // Imported mappings by device address; shared with the mappings, which may outlive the runtime.
  struct Regions {
    mutable absl::Mutex mu;
    std::map<const std::byte*, Region> by_address ABSL_GUARDED_BY(mu);
    // The region starting at or below p, and p's offset into it (which may be past its end);
    // null when none starts there.
    const Region* AtOrBelowLocked(const std::byte* p, uint64_t* offset) const
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  };
  static constexpr char kFakeIpcMagic[8] = {'R', 'Y', 'F', 'K', 'I', 'P', 'C', '1'};
  struct FakeIpcHandle {
    char magic[8];
    int64_t pid;
    int32_t fd;
    char unused[44];
  };
  static_assert(sizeof(FakeIpcHandle) == kCudaIpcHandleBytes);
  // Maps [offset, offset + size) of the fake allocation fd (not taken), after Import's checks.
  absl::StatusOr<std::shared_ptr<DeviceMapping>> Map(int device, int fd, uint64_t offset,
                                                     uint64_t size);
  // The host address of [ptr, ptr + bytes) of device memory on `device`, or INVALID_ARGUMENT.
  absl::StatusOr<std::byte*> Translate(int device, const void* ptr, uint64_t bytes) const;

  const int devices_;
  const bool peer_access_;
  const std::shared_ptr<Regions> regions_ = std::make_shared<Regions>();
  std::atomic<uint64_t> steps_{0};
  std::atomic<uint64_t> pinned_allocations_{0};
};

}  // namespace railyard::device
