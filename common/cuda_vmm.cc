#include "common/cuda_vmm.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace railyard::internal {

const CudaVmm& GetCudaVmm() {
  static const CudaVmm* const vmm = [] {
    auto* v = new CudaVmm;
    int count = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it
      v->status = absl::FailedPreconditionError(absl::StrCat(
          "CUDA is not usable here (cudaGetDeviceCount: ", cudaGetErrorString(e), ")"));
      return v;
    }
    struct {
      const char* name;
      void** fn;
    } const symbols[] = {
        {"cuMemCreate", reinterpret_cast<void**>(&v->Create)},
        {"cuMemRelease", reinterpret_cast<void**>(&v->Release)},
        {"cuMemGetAllocationGranularity", reinterpret_cast<void**>(&v->GetAllocationGranularity)},
        {"cuMemAddressReserve", reinterpret_cast<void**>(&v->AddressReserve)},
        {"cuMemAddressFree", reinterpret_cast<void**>(&v->AddressFree)},
        {"cuMemMap", reinterpret_cast<void**>(&v->Map)},
        {"cuMemUnmap", reinterpret_cast<void**>(&v->Unmap)},
        {"cuMemSetAccess", reinterpret_cast<void**>(&v->SetAccess)},
        {"cuMemExportToShareableHandle", reinterpret_cast<void**>(&v->Export)},
        {"cuMemImportFromShareableHandle", reinterpret_cast<void**>(&v->Import)},
        {"cuMemGetAllocationPropertiesFromHandle",
         reinterpret_cast<void**>(&v->GetAllocationPropertiesFromHandle)},
        {"cuGetErrorString", reinterpret_cast<void**>(&v->GetErrorString)},
        {"cuDeviceGet", reinterpret_cast<void**>(&v->DeviceGet)},
        {"cuDeviceGetAttribute", reinterpret_cast<void**>(&v->DeviceGetAttribute)},
        {"cuMemHostRegister", reinterpret_cast<void**>(&v->MemHostRegister)},
        {"cuMemHostUnregister", reinterpret_cast<void**>(&v->MemHostUnregister)},
        {"cuMemHostGetDevicePointer", reinterpret_cast<void**>(&v->MemHostGetDevicePointer)},
        {"cuStreamWriteValue32", reinterpret_cast<void**>(&v->StreamWriteValue32)},
        {"cuStreamWaitValue32", reinterpret_cast<void**>(&v->StreamWaitValue32)},
        {"cuMemGetAddressRange", reinterpret_cast<void**>(&v->GetAddressRange)},
        {"cuMemRetainAllocationHandle", reinterpret_cast<void**>(&v->RetainAllocationHandle)},
        {"cuPointerGetAttribute", reinterpret_cast<void**>(&v->PointerGetAttribute)},
        {"cuIpcGetMemHandle", reinterpret_cast<void**>(&v->IpcGetMemHandle)},
        {"cuIpcOpenMemHandle", reinterpret_cast<void**>(&v->IpcOpenMemHandle)},
        {"cuIpcCloseMemHandle", reinterpret_cast<void**>(&v->IpcCloseMemHandle)},
    };
    for (const auto& s : symbols) {
      cudaDriverEntryPointQueryResult found{};
      const cudaError_t e =
          cudaGetDriverEntryPointByVersion(s.name, s.fn, 12000, cudaEnableDefault, &found);
      if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || *s.fn == nullptr) {
        v->status = absl::FailedPreconditionError(
            absl::StrCat("the CUDA driver has no ", s.name, " (", cudaGetErrorString(e),
                         "): device memory needs a driver with the VMM API (CUDA 12 or later)"));
        return v;
      }
    }
    return v;
  }();
  return *vmm;
}

std::string CudaDriverError(CUresult r) {
  const char* s = nullptr;
  const CudaVmm& v = GetCudaVmm();
  if (v.GetErrorString == nullptr || v.GetErrorString(r, &s) != CUDA_SUCCESS || s == nullptr) {
    return absl::StrCat("CUresult ", static_cast<int>(r));
  }
  return s;
}

}  // namespace railyard::internal
