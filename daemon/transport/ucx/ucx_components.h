// What the installed UCX can move: its UCT components (tcp, self, sysv, posix, cma, ib, rdmacm,
// and, where UCX was built with CUDA, cuda_cpy, cuda_ipc, gdr_copy). The daemon reports whether
// device memory could cross nodes through UCX's CUDA transports (GPUDirect) or is staged through
// host memory (docs/gpu.md, "Across nodes").
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace railyard::transport {

// The component names, in UCX's order; an error names the UCX call that failed.
absl::StatusOr<std::vector<std::string>> UcxComponents();

// The CUDA transports among them (names containing "cuda" or "gdr").
std::vector<std::string> CudaTransports(const std::vector<std::string>& components);

}  // namespace railyard::transport
