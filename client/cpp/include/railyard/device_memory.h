// Device memory a process allocates to share with railyardd: a CUDA VMM allocation
// (cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), mapped read-write into this process
// on its device, which the daemon imports from a file descriptor (no hostIPC needed between
// containers: the descriptor travels over the session's side channel).
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace railyard
