// DeviceRuntime on CUDA (built when nvcc is found): device memory imported from the POSIX file
// descriptor of a VMM allocation (cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess), the
// kernels of daemon/kernels/cuda on one non-blocking stream per device. The CUDA runtime is
// linked statically and reaches the driver (libcuda.so.1) only when opened, through
// cudaGetDriverEntryPointByVersion: the daemon never links libcuda, so one binary runs on nodes
// with and without NVIDIA GPUs.
#pragma once

#include <memory>

#include "daemon/device/device_runtime.h"

namespace railyard::device {

// CUDA's runtime with the devices it sees (0 is fine: cudaErrorNoDevice); FAILED_PRECONDITION
// naming CUDA's error when there is no usable driver or the driver lacks the VMM entry points.
absl::StatusOr<std::unique_ptr<DeviceRuntime>> OpenCudaDeviceRuntime();

}  // namespace railyard::device
