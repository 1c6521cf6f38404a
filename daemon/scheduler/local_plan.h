// The intra-node schedule of one merged operation: independent memory steps over the ranks'
// mapped buffers. Steps of a plan may run in any order and in parallel; each is a few hundred
// KiB so that the worker pool can spread one large operation over all its threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "daemon/device/device_runtime.h"
#include "daemon/kernels/types.h"
#include "daemon/scheduler/op.h"

namespace railyard::scheduler {

struct LocalStep {
  enum class Kind : uint8_t {
    kReduce,  // reduce srcs into dsts[0], copy the result into the other dsts (count: elements)
    kCopy,    // for k in order: copy srcs[k] -> dsts[k] (count: bytes)
    kSwap,    // exchange srcs[0] and dsts[0] (count: bytes)
  };
  Kind kind = Kind::kCopy;
  uint32_t src_begin = 0;  // index into LocalPlan::ptrs
  uint32_t nsrcs = 0;
  uint32_t dst_begin = 0;
  uint32_t ndsts = 0;
  uint64_t count = 0;
};

// Reused from one operation to the next: Clear() keeps the capacity, so steady-state planning
// allocates nothing.
struct LocalPlan {
  kernels::DataType dtype = kernels::DataType::kFloat32;
  kernels::RedOp red_op = kernels::RedOp::kSum;
  uint32_t avg_divisor = 1;
  // The CUDA device every pointer is memory of (the steps run there, through the executor's
  // device::DeviceRuntime); -1: host memory (RunStep).
  int device = -1;
  std::vector<LocalStep> steps;
  std::vector<std::byte*> ptrs;
  uint64_t bytes_moved = 0;  // bytes written to destination buffers, for stats
  // Planner scratch (per-rank pointer lists), kept here so that it is reused too.
  std::vector<std::byte*> scratch_srcs;
  std::vector<std::byte*> scratch_dsts;

  void Clear() {
    device = -1;
    steps.clear();
    ptrs.clear();
    bytes_moved = 0;
  }
};

// Default step size: big enough to amortise dispatch, small enough to split 1 MiB over 2+ threads.
inline constexpr size_t kDefaultChunkBytes = 256 * 1024;
// Device plans: one step per region (bounded so that offsets plus a chunk cannot overflow).
inline constexpr size_t kDeviceChunkBytes = size_t{1} << 62;

// Plans a complete merged collective (one request per rank, all present and in agreement).
void BuildLocalPlan(const std::vector<const RankRequest*>& requests, size_t chunk_bytes,
                    LocalPlan* plan);

// Adds the steps of another complete merged collective to plan (a fused group): it must have the
// dtype, red_op and rank count of what plan holds.
void AppendLocalPlan(const std::vector<const RankRequest*>& requests, size_t chunk_bytes,
                     LocalPlan* plan);

// Plans a matched Send/Recv pair: bytes from send to recv (memory of `device`, -1: host).
void BuildCopyPlan(std::byte* src, std::byte* dst, uint64_t bytes, size_t chunk_bytes,
                   LocalPlan* plan, int device = -1);

// Runs step i of a host plan (called by the executor's workers).
void RunStep(const LocalPlan& plan, size_t i);

// Runs every step of a device plan (plan.device >= 0) in order on that device's stream and waits
// for them: the first error a launch or the stream met, naming the step.
absl::Status RunDeviceSteps(const LocalPlan& plan, device::DeviceRuntime* devices);

}  // namespace railyard::scheduler
