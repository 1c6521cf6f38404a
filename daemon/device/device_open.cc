// OpenDeviceRuntime: CUDA's when this build has it, else a clear "no".
#include "daemon/device/device_runtime.h"

#if RAILYARD_DEVICE_CUDA
#include "daemon/device/cuda_device_runtime.h"
#endif

namespace railyard::device {

absl::StatusOr<std::unique_ptr<DeviceRuntime>> OpenDeviceRuntime() {
#if RAILYARD_DEVICE_CUDA
  return OpenCudaDeviceRuntime();
#else
  return absl::FailedPreconditionError(
      "this railyardd was built without CUDA (nvcc was not found): serving host memory only");
#endif
}

}  // namespace railyard::device
