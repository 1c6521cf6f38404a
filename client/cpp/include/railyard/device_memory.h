// Device memory a process allocates to share with railyardd: a CUDA VMM allocation
// (cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), mapped read-write into this process
// on its device, which the daemon imports from a file descriptor (no hostIPC needed between
// containers: the descriptor travels over the session's side channel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace railyard {

class DeviceMemory {
 public:
  // At least `bytes` (> 0) on `device`, rounded up to the allocation granularity.
  // FAILED_PRECONDITION when this library was built without CUDA, the node has no usable driver,
  // or the device has no VMM support; INVALID_ARGUMENT for a device it does not have.
  static absl::StatusOr<DeviceMemory> Allocate(size_t bytes, int device);

  DeviceMemory() = default;
  DeviceMemory(DeviceMemory&& o) noexcept;
  DeviceMemory& operator=(DeviceMemory&& o) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory();

  // The device address of the first byte (cudaMemcpy and kernels use it; the host cannot).
  void* data() const { return reinterpret_cast<void*>(ptr_); }
  size_t size() const { return size_; }
  size_t allocated() const { return allocated_; }
  int device() const { return device_; }
  bool valid() const { return ptr_ != 0; }

  // A new descriptor for the allocation; the caller owns (and closes or sends) it.
  absl::StatusOr<int> ExportFd() const;

 private:
  void Reset();
  uint64_t handle_ = 0;  // CUmemGenericAllocationHandle
  uintptr_t ptr_ = 0;    // CUdeviceptr
  size_t size_ = 0;
  size_t allocated_ = 0;
  int device_ = -1;
};

// How device memory allocated elsewhere (a framework's allocator) can be shared with railyardd:
// the allocation's descriptor when it is a VMM allocation that exports one, else a legacy CUDA
// IPC handle (cudaIpcGetMemHandle: what cudaMalloc'd memory offers).
struct DevicePointerExport {
  int fd = -1;             // VMM: a new descriptor for the allocation (the caller closes it)
  std::string ipc_handle;  // else: the allocation's cudaIpcMemHandle_t (64 bytes)
  uint64_t offset = 0;     // the pointer's offset from its allocation's start
};
// Exports [ptr, ptr + size) of device memory on `device`. INVALID_ARGUMENT when the range is not
// within one allocation of that device, or is a VMM allocation's from another offset than 0 (the
// daemon maps descriptors from their start); FAILED_PRECONDITION without CUDA or a usable driver.
absl::StatusOr<DevicePointerExport> ExportDevicePointer(const void* ptr, size_t size, int device);

}  // namespace railyard
