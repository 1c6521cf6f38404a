// The CUDA driver's virtual-memory entry points, reached through the static CUDA runtime
// (cudaGetDriverEntryPointByVersion) so that nothing links libcuda: the client's DeviceMemory
// and the daemon's CudaDeviceRuntime both use them, and both run (without devices) on nodes with
// no NVIDIA driver. Built only with CUDA (RAILYARD_WITH_CUDA).
#pragma once

#include <cuda.h>

#include <string>

#include "absl/status/status.h"

namespace railyard::internal {

struct CudaVmm {
  CUresult (*Create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long) = nullptr;
  CUresult (*Release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*GetAllocationGranularity)(size_t*, const CUmemAllocationProp*,
                                       CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*AddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                             unsigned long long) = nullptr;
  CUresult (*AddressFree)(CUdeviceptr, size_t) = nullptr;
  CUresult (*Map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long) = nullptr;
  CUresult (*Unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*SetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*Export)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                     unsigned long long) = nullptr;
  CUresult (*Import)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  CUresult (*GetAllocationPropertiesFromHandle)(CUmemAllocationProp*,
                                                CUmemGenericAllocationHandle) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  // Stream ordering (railyard/stream_ops.h): host words streams store into and wait on.
  CUresult (*MemHostRegister)(void*, size_t, unsigned int) = nullptr;
  CUresult (*MemHostUnregister)(void*) = nullptr;
  CUresult (*MemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned int) = nullptr;
  CUresult (*StreamWriteValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*StreamWaitValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  // Registering device pointers (Client::RegisterDevicePointer) and legacy CUDA IPC, the
  // fallback for memory that is not a VMM allocation (cudaMalloc's).
  CUresult (*GetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*RetainAllocationHandle)(CUmemGenericAllocationHandle*, void*) = nullptr;
  CUresult (*PointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
  CUresult (*IpcGetMemHandle)(CUipcMemHandle*, CUdeviceptr) = nullptr;
  CUresult (*IpcOpenMemHandle)(CUdeviceptr*, CUipcMemHandle, unsigned int) = nullptr;
  CUresult (*IpcCloseMemHandle)(CUdeviceptr) = nullptr;
  // OK when every entry point above was found; else FAILED_PRECONDITION saying what is missing
  // (no usable driver: CUDA's own error; a driver older than the VMM API).
  absl::Status status;
};

// Looked up once per process; never destroyed (mappings may be released during exit).
const CudaVmm& GetCudaVmm();

// "CUDA_ERROR_INVALID_VALUE"-style text of a driver result.
std::string CudaDriverError(CUresult r);

}  // namespace railyard::internal
