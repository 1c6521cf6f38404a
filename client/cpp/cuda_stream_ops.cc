// CudaStreamOps (railyard/stream_ops.h): CUDA's stream memory operations on host words.
#include <utility>

#include "absl/strings/str_cat.h"
#include "railyard/stream_ops.h"

#if RAILYARD_CLIENT_CUDA
#include <cuda_runtime_api.h>

#include "common/cuda_vmm.h"
#endif

namespace railyard {

#if RAILYARD_CLIENT_CUDA
namespace {

using internal::CudaDriverError;
using internal::CudaVmm;

class CudaOps : public StreamOps {
 public:
  explicit CudaOps(const CudaVmm& d) : d_(d) {}

  absl::StatusOr<uint64_t> MapHostWords(void* p, size_t bytes) override {
    // The driver calls need a context: the runtime's primary one on the current device.
    if (const cudaError_t e = cudaFree(nullptr); e != cudaSuccess) {
      return absl::FailedPreconditionError(
          absl::StrCat("no CUDA context for stream ordering: ", cudaGetErrorString(e)));
    }
    if (CUresult r = d_.MemHostRegister(p, bytes,
                                        CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
        r != CUDA_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuMemHostRegister: ", CudaDriverError(r)));
    }
    CUdeviceptr addr = 0;
    if (CUresult r = d_.MemHostGetDevicePointer(&addr, p, 0); r != CUDA_SUCCESS) {
      d_.MemHostUnregister(p);
      return absl::InternalError(absl::StrCat("cuMemHostGetDevicePointer: ", CudaDriverError(r)));
    }
    return static_cast<uint64_t>(addr);
  }

  void UnmapHostWords(void* p) override { d_.MemHostUnregister(p); }

  absl::Status WriteValue(void* stream, uint64_t addr, uint32_t value) override {
    if (CUresult r = d_.StreamWriteValue32(static_cast<CUstream>(stream),
                                           static_cast<CUdeviceptr>(addr), value, 0);
        r != CUDA_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuStreamWriteValue32: ", CudaDriverError(r)));
    }
    return absl::OkStatus();
  }

  absl::Status WaitValue(void* stream, uint64_t addr, uint32_t value) override {
    if (CUresult r =
            d_.StreamWaitValue32(static_cast<CUstream>(stream), static_cast<CUdeviceptr>(addr),
                                 value, CU_STREAM_WAIT_VALUE_GEQ);
        r != CUDA_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuStreamWaitValue32: ", CudaDriverError(r)));
    }
    return absl::OkStatus();
  }

 private:
  const CudaVmm& d_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<StreamOps>> CudaStreamOps() {
  const CudaVmm& d = internal::GetCudaVmm();
  if (!d.status.ok()) return d.status;
  return std::make_shared<CudaOps>(d);
}

#else

absl::StatusOr<std::shared_ptr<StreamOps>> CudaStreamOps() {
  return absl::FailedPreconditionError(
      "this client was built without CUDA: operations cannot be ordered on a CUDA stream (give "
      "ClientOptions::stream_ops, or use CollectiveOptions::stream_sync)");
}

#endif

}  // namespace railyard
