// The daemon's seam to GPU memory: importing device memory a client exported, and running the
// one-node steps of an operation (reduce into many, copy, swap) on it. Two implementations:
// CudaDeviceRuntime (cuda_device_runtime.h, built when nvcc is found; CUDA's driver through the
// runtime library's entry points, so a daemon built with CUDA still starts, without devices, on a
// node with no NVIDIA driver) and FakeDeviceRuntime (fake_device_runtime.h: "device memory" is a
// memfd, for testing everything around the device on hosts without one).
//
// A device pointer is never dereferenced on the host: only the runtime's own calls touch it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/kernels/types.h"
#include "daemon/util/unique_fd.h"

namespace railyard::device {

// Memory of one device mapped into this process's device address space; unmapped (and the
// imported allocation released) on destruction.
class DeviceMapping {
 public:
  virtual ~DeviceMapping() = default;
  // The device address of the first byte. Not host memory.
  virtual std::byte* data() const = 0;
  // Bytes the client asked to register (the mapping may be rounded up past it).
  virtual uint64_t size() const = 0;
  virtual int device() const = 0;
};

// Page-locked host memory, every page resident, freed on destruction: device copies to and from
// it run at the bus's speed, where pageable memory goes through the driver's own bounce buffers.
class PinnedHostMemory {
 public:
  virtual ~PinnedHostMemory() = default;
  virtual std::byte* data() const = 0;
  virtual size_t size() const = 0;
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;

  // Devices this process can use (ordinals 0..count-1).
  virtual int DeviceCount() const = 0;
  // One line for logs and status: what the runtime is and what it found.
  virtual std::string Describe() const = 0;

  // Maps `size` bytes of the device allocation a client exported as a POSIX file descriptor
  // (cuMemExportToShareableHandle with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR). Checks, each
  // with a status saying what is wrong: size > 0 (INVALID_ARGUMENT); device in [0, count)
  // (INVALID_ARGUMENT naming the count); the descriptor is an allocation this runtime can import
  // (INVALID_ARGUMENT); the allocation lives on `device` (INVALID_ARGUMENT naming both); the
  // allocation holds `size` bytes (INVALID_ARGUMENT). The descriptor is closed either way.
  virtual absl::StatusOr<std::shared_ptr<DeviceMapping>> Import(int device, UniqueFd fd,
                                                                uint64_t size) = 0;

  // Maps `size` bytes at `offset` of the allocation a client exported with legacy CUDA IPC
  // (cudaIpcGetMemHandle: `handle` is the kCudaIpcHandleBytes-byte cudaIpcMemHandle_t). Checks as
  // Import's, plus: the handle's length (INVALID_ARGUMENT), and offset + size within the
  // allocation (INVALID_ARGUMENT). client_pid is the registering process as the kernel reports
  // it; CUDA's handles do not say which process made them (so CUDA's runtime cannot check it;
  // the fake's handles do, and it refuses another process's with PERMISSION_DENIED).
  static constexpr size_t kCudaIpcHandleBytes = 64;
  virtual absl::StatusOr<std::shared_ptr<DeviceMapping>> ImportIpc(int device,
                                                                   std::string_view handle,
                                                                   uint64_t offset, uint64_t size,
                                                                   int64_t client_pid) = 0;

  // The device whose imported memory holds ptr, or -1 (not device memory imported here).
  virtual int DeviceOf(const void* ptr) const = 0;
  // Whether launches on device `from` may read and write memory of device `to`: true for
  // from == to, and for peers (NVLink or PCIe P2P) the runtime granted access to at import.
  virtual bool CanAccessPeer(int from, int to) const = 0;

  // Enqueues on `device`'s stream (in call order):
  //   dsts[d][i] = srcs[0][i] (op) ... (op) srcs[nsrcs-1][i] for every d, i < count elements,
  //     with the semantics of kernels::ReduceToMany (1 <= nsrcs, ndsts <= kMaxPointers);
  //   a copy of `bytes` from src to dst;
  //   an exchange of two non-overlapping regions.
  // Every pointer is a device address from Import, of `device` or of a device it can access
  // (CanAccessPeer). An error is the launch's.
  static constexpr int kMaxPointers = 32;
  virtual absl::Status ReduceToMany(int device, kernels::DataType dtype, kernels::RedOp op,
                                    void* const* dsts, int ndsts, const void* const* srcs,
                                    int nsrcs, size_t count, uint32_t avg_divisor) = 0;
  virtual absl::Status Copy(int device, void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Swap(int device, void* a, void* b, size_t bytes) = 0;
  // Copies between host memory and device memory on `device`, and waits for the copy (and what
  // was enqueued before it on the device's stream).
  virtual absl::Status CopyToHost(int device, void* host_dst, const void* device_src,
                                  size_t bytes) = 0;
  virtual absl::Status CopyFromHost(int device, void* device_dst, const void* host_src,
                                    size_t bytes) = 0;
  // `bytes` (> 0) of page-locked host memory usable with every device (cudaHostAlloc, portable),
  // or RESOURCE_EXHAUSTED naming the cause.
  virtual absl::StatusOr<std::unique_ptr<PinnedHostMemory>> AllocatePinned(size_t bytes) = 0;
  // Waits until everything enqueued on `device` before the call has finished; the first error
  // any of it met (INTERNAL, naming the CUDA error).
  virtual absl::Status Synchronize(int device) = 0;
};

// The runtime of this build on this node: CUDA's when the daemon was built with CUDA and a
// driver is present (it may see no device: DeviceCount() 0), otherwise FAILED_PRECONDITION
// saying which is missing (the daemon then serves host memory only).
absl::StatusOr<std::unique_ptr<DeviceRuntime>> OpenDeviceRuntime();

}  // namespace railyard::device
