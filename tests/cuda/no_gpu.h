// Why a test cannot run on a GPU here, or "" when it can: GPU tests skip with this reason.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace railyard::testing {

inline std::string NoGpu() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: cudaGetDeviceCount says ") + cudaGetErrorString(e);
  }
  return n == 0 ? "no CUDA device on this node" : "";
}

}  // namespace railyard::testing
