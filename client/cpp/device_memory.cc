#include "railyard/device_memory.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#if RAILYARD_CLIENT_CUDA
#include <cuda_runtime_api.h>
#include <unistd.h>

#include "common/cuda_vmm.h"
#endif

namespace railyard {

DeviceMemory::DeviceMemory(DeviceMemory&& o) noexcept
    : handle_(std::exchange(o.handle_, 0)),
      ptr_(std::exchange(o.ptr_, 0)),
      size_(std::exchange(o.size_, 0)),
      allocated_(std::exchange(o.allocated_, 0)),
      device_(std::exchange(o.device_, -1)) {}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
  if (this != &o) {
    Reset();
    handle_ = std::exchange(o.handle_, 0);
    ptr_ = std::exchange(o.ptr_, 0);
    size_ = std::exchange(o.size_, 0);
    allocated_ = std::exchange(o.allocated_, 0);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

DeviceMemory::~DeviceMemory() { Reset(); }

#if RAILYARD_CLIENT_CUDA
namespace {

using internal::CudaVmm;

const CudaVmm& GetVmm() { return internal::GetCudaVmm(); }

absl::Status Fail(absl::StatusCode code, const char* what, CUresult r) {
  return absl::Status(code, absl::StrCat(what, ": ", internal::CudaDriverError(r)));
}

}  // namespace

absl::StatusOr<DeviceMemory> DeviceMemory::Allocate(size_t bytes, int device) {
  if (bytes == 0) return absl::InvalidArgumentError("device memory size must be > 0");
  const CudaVmm& v = GetVmm();
  if (!v.status.ok()) return v.status;
  int count = 0;
  cudaGetDeviceCount(&count);
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", device, " is not one of the ", count, " devices here"));
  }
  int vmm = 0;
  CUdevice dev{};
  if (v.DeviceGet(&dev, device) != CUDA_SUCCESS ||
      v.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
          CUDA_SUCCESS ||
      vmm == 0) {
    return absl::FailedPreconditionError(absl::StrCat("device ", device, " has no VMM support"));
  }
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaSetDevice: ", cudaGetErrorString(e)));
  }
  cudaFree(nullptr);  // makes the primary context current, as the driver calls below need
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  CUresult r = v.GetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS || gran == 0) {
    return Fail(absl::StatusCode::kInternal, "cuMemGetAllocationGranularity", r);
  }
  DeviceMemory m;
  m.size_ = bytes;
  m.allocated_ = (bytes + gran - 1) / gran * gran;
  m.device_ = device;
  CUmemGenericAllocationHandle h{};
  if ((r = v.Create(&h, m.allocated_, &prop, 0)) != CUDA_SUCCESS) {
    return Fail(absl::StatusCode::kResourceExhausted, "cuMemCreate", r);
  }
  CUdeviceptr p = 0;
  if ((r = v.AddressReserve(&p, m.allocated_, gran, 0, 0)) != CUDA_SUCCESS) {
    v.Release(h);
    return Fail(absl::StatusCode::kResourceExhausted, "cuMemAddressReserve", r);
  }
  if ((r = v.Map(p, m.allocated_, 0, h, 0)) != CUDA_SUCCESS) {
    v.AddressFree(p, m.allocated_);
    v.Release(h);
    return Fail(absl::StatusCode::kInternal, "cuMemMap", r);
  }
  m.handle_ = h;
  m.ptr_ = p;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if ((r = v.SetAccess(p, m.allocated_, &access, 1)) != CUDA_SUCCESS) {
    return Fail(absl::StatusCode::kInternal, "cuMemSetAccess", r);  // m's destructor unmaps
  }
  return m;
}

absl::StatusOr<int> DeviceMemory::ExportFd() const {
  if (!valid()) return absl::FailedPreconditionError("no device memory to export");
  int fd = -1;
  if (CUresult r = GetVmm().Export(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS) {
    return Fail(absl::StatusCode::kInternal, "cuMemExportToShareableHandle", r);
  }
  return fd;
}

absl::StatusOr<DevicePointerExport> ExportDevicePointer(const void* ptr, size_t size, int device) {
  if (size == 0) return absl::InvalidArgumentError("cannot register 0 bytes of device memory");
  const CudaVmm& v = GetVmm();
  if (!v.status.ok()) return v.status;
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::InvalidArgumentError(
        absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorString(e)));
  }
  cudaFree(nullptr);  // the primary context, current
  const auto p = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr));
  CUdeviceptr base = 0;
  size_t bytes = 0;
  int ordinal = -1;
  CUresult r = v.GetAddressRange(&base, &bytes, p);
  if (r == CUDA_SUCCESS) {
    r = v.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
  }
  if (r != CUDA_SUCCESS) {
    return Fail(absl::StatusCode::kInvalidArgument, "not device memory (cuMemGetAddressRange)", r);
  }
  if (ordinal != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("the pointer is memory of device ", ordinal, ", not of device ", device));
  }
  DevicePointerExport out;
  out.offset = p - base;
  if (out.offset > bytes || size > bytes - out.offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(size, " bytes at offset ", out.offset, " run past the allocation's ", bytes));
  }
  CUmemGenericAllocationHandle h{};
  if (v.RetainAllocationHandle(&h, const_cast<void*>(ptr)) == CUDA_SUCCESS) {  // VMM memory
    int fd = -1;
    r = v.Export(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    v.Release(h);
    if (r != CUDA_SUCCESS) {
      return Fail(absl::StatusCode::kFailedPrecondition,
                  "the VMM allocation exports no file descriptor (create it with "
                  "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)",
                  r);
    }
    if (out.offset != 0) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("a VMM allocation is registered from its start; this pointer is at offset ",
                       out.offset, " (register the allocation and use offsets into the buffer)"));
    }
    out.fd = fd;
    return out;
  }
  CUipcMemHandle handle{};
  if ((r = v.IpcGetMemHandle(&handle, base)) != CUDA_SUCCESS) {
    return Fail(absl::StatusCode::kFailedPrecondition, "cuIpcGetMemHandle", r);
  }
  out.ipc_handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  return out;
}

void DeviceMemory::Reset() {
  if (ptr_ == 0 && handle_ == 0) return;
  const CudaVmm& v = GetVmm();
  if (ptr_ != 0) {
    v.Unmap(ptr_, allocated_);
    v.AddressFree(ptr_, allocated_);
  }
  if (handle_ != 0) v.Release(handle_);
  ptr_ = 0;
  handle_ = 0;
}

#else  // !RAILYARD_CLIENT_CUDA

absl::StatusOr<DeviceMemory> DeviceMemory::Allocate(size_t, int) {
  return absl::FailedPreconditionError(
      "this Railyard client was built without CUDA (nvcc was not found): no device memory");
}

absl::StatusOr<int> DeviceMemory::ExportFd() const {
  return absl::FailedPreconditionError("no device memory to export");
}

absl::StatusOr<DevicePointerExport> ExportDevicePointer(const void*, size_t, int) {
  return absl::FailedPreconditionError(
      "this Railyard client was built without CUDA (nvcc was not found): no device memory");
}

void DeviceMemory::Reset() {}

#endif

}  // namespace railyard
