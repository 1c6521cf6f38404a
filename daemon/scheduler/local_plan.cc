#include "daemon/scheduler/local_plan.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/kernels/reduce.h"

namespace railyard::scheduler {
namespace {

// Appends chunked steps to a plan. Pointer lists are passed as (pointer, count) pairs of the
// caller's small arrays so that planning does not allocate once the plan has grown to size.
class PlanBuilder {
 public:
  PlanBuilder(LocalPlan* plan, size_t chunk_bytes, size_t esize)
      : plan_(plan), chunk_bytes_(std::max<size_t>(chunk_bytes, 64)), esize_(esize) {}

  // Reduces count elements of every src into every dst (same offsets).
  void Reduce(std::byte* const* srcs, uint32_t nsrcs, std::byte* const* dsts, uint32_t ndsts,
              uint64_t count) {
    if (count == 0 || ndsts == 0) return;
    const uint64_t chunk = std::max<uint64_t>(1, chunk_bytes_ / esize_);
    for (uint64_t off = 0; off < count; off += chunk) {
      LocalStep step;
      step.kind = LocalStep::Kind::kReduce;
      step.count = std::min(chunk, count - off);
      step.src_begin = Push(srcs, nsrcs, off * esize_);
      step.nsrcs = nsrcs;
      step.dst_begin = Push(dsts, ndsts, off * esize_);
      step.ndsts = ndsts;
      plan_->steps.push_back(step);
    }
    plan_->bytes_moved += count * esize_ * ndsts;
  }

  // Copies bytes from srcs[k] to dsts[k], k in order within each chunk. Pairs whose source and
  // destination are the same address are dropped (nothing to move).
  void Copy(std::byte* const* srcs, std::byte* const* dsts, uint32_t npairs, uint64_t bytes) {
    uint32_t kept = 0;
    for (uint32_t k = 0; k < npairs; ++k) kept += srcs[k] != dsts[k] ? 1 : 0;
    if (bytes == 0 || kept == 0) return;
    for (uint64_t off = 0; off < bytes; off += chunk_bytes_) {
      LocalStep step;
      step.kind = LocalStep::Kind::kCopy;
      step.count = std::min<uint64_t>(chunk_bytes_, bytes - off);
      step.src_begin = static_cast<uint32_t>(plan_->ptrs.size());
      for (uint32_t k = 0; k < npairs; ++k) {
        if (srcs[k] != dsts[k]) plan_->ptrs.push_back(srcs[k] + off);
      }
      step.nsrcs = kept;
      step.dst_begin = static_cast<uint32_t>(plan_->ptrs.size());
      for (uint32_t k = 0; k < npairs; ++k) {
        if (srcs[k] != dsts[k]) plan_->ptrs.push_back(dsts[k] + off);
      }
      step.ndsts = kept;
      plan_->steps.push_back(step);
    }
    plan_->bytes_moved += bytes * kept;
  }

  void Swap(std::byte* a, std::byte* b, uint64_t bytes) {
    if (bytes == 0 || a == b) return;
    for (uint64_t off = 0; off < bytes; off += chunk_bytes_) {
      LocalStep step;
      step.kind = LocalStep::Kind::kSwap;
      step.count = std::min<uint64_t>(chunk_bytes_, bytes - off);
      step.src_begin = Push(&a, 1, off);
      step.nsrcs = 1;
      step.dst_begin = Push(&b, 1, off);
      step.ndsts = 1;
      plan_->steps.push_back(step);
    }
    plan_->bytes_moved += 2 * bytes;
  }

 private:
  uint32_t Push(std::byte* const* ptrs, uint32_t n, uint64_t offset) {
    const auto begin = static_cast<uint32_t>(plan_->ptrs.size());
    for (uint32_t i = 0; i < n; ++i) plan_->ptrs.push_back(ptrs[i] + offset);
    return begin;
  }

  LocalPlan* plan_;
  size_t chunk_bytes_;
  size_t esize_;
};

// One block of an AllToAll(v): what rank `from` sends to rank `to`.
struct Block {
  std::byte* src;
  std::byte* dst;
  uint64_t bytes;
};

Block AllToAllBlock(const std::vector<const RankRequest*>& reqs, int from, int to, size_t esize) {
  const RankRequest& f = *reqs[from];
  const RankRequest& t = *reqs[to];
  if (f.op == OpKind::kAllToAllv) {
    if (f.send_counts[to] == 0) return Block{nullptr, nullptr, 0};  // buffers may be absent
    return Block{f.send + f.send_displs[to] * esize, t.recv + t.recv_displs[from] * esize,
                 f.send_counts[to] * esize};
  }
  const uint64_t bytes = f.count * esize;
  return Block{f.send + static_cast<uint64_t>(to) * bytes,
               t.recv + static_cast<uint64_t>(from) * bytes, bytes};
}

void PlanAllToAll(const std::vector<const RankRequest*>& reqs, size_t esize, PlanBuilder& b) {
  const int n = static_cast<int>(reqs.size());
  for (int r = 0; r < n; ++r) {
    const Block self = AllToAllBlock(reqs, r, r, esize);
    b.Copy(&self.src, &self.dst, 1, self.bytes);
    const bool r_in_place = IsInPlace(*reqs[r], r);
    for (int j = r + 1; j < n; ++j) {
      const bool j_in_place = IsInPlace(*reqs[j], j);
      const Block rj = AllToAllBlock(reqs, r, j, esize);  // r's block for j
      const Block jr = AllToAllBlock(reqs, j, r, esize);  // j's block for r
      if (r_in_place && j_in_place) {
        // rj.src is jr.dst and jr.src is rj.dst: an exchange (equal sizes by count symmetry).
        b.Swap(rj.src, jr.src, rj.bytes);
      } else if (r_in_place || j_in_place) {
        // The in-place rank's outgoing block is overwritten by its incoming one: read it first.
        // Count symmetry plus send == recv layout makes both blocks the same size.
        const Block& first = r_in_place ? rj : jr;
        const Block& second = r_in_place ? jr : rj;
        std::byte* srcs[2] = {first.src, second.src};
        std::byte* dsts[2] = {first.dst, second.dst};
        b.Copy(srcs, dsts, 2, first.bytes);
      } else {
        b.Copy(&rj.src, &rj.dst, 1, rj.bytes);
        b.Copy(&jr.src, &jr.dst, 1, jr.bytes);
      }
    }
  }
}

}  // namespace

void BuildLocalPlan(const std::vector<const RankRequest*>& reqs, size_t chunk_bytes,
                    LocalPlan* plan) {
  plan->Clear();
  AppendLocalPlan(reqs, chunk_bytes, plan);
}

void AppendLocalPlan(const std::vector<const RankRequest*>& reqs, size_t chunk_bytes,
                     LocalPlan* plan) {
  const RankRequest& r0 = *reqs[0];
  const auto n = static_cast<uint32_t>(reqs.size());
  // On a device a step is a kernel launch (or a copy) the GPU spreads over all its cores itself:
  // one per region, not one per worker-sized chunk.
  if (r0.device >= 0) chunk_bytes = kDeviceChunkBytes;
  plan->device = r0.device;
  plan->dtype = r0.dtype;
  plan->red_op = r0.red_op;
  plan->avg_divisor = n;
  const size_t esize = kernels::ElementSize(r0.dtype);
  const uint64_t c = r0.count;
  const uint64_t seg = c * esize;
  PlanBuilder b(plan, chunk_bytes, esize);
  // Per-rank pointer arrays (a comm has few local ranks; these are small).
  std::vector<std::byte*>& srcs = plan->scratch_srcs;
  std::vector<std::byte*>& dsts = plan->scratch_dsts;
  srcs.resize(n);
  dsts.resize(n);
  switch (r0.op) {
    case OpKind::kAllReduce:
      for (uint32_t r = 0; r < n; ++r) {
        srcs[r] = reqs[r]->send;
        dsts[r] = reqs[r]->recv;
      }
      b.Reduce(srcs.data(), n, dsts.data(), n, c);
      break;
    case OpKind::kReduce:
      for (uint32_t r = 0; r < n; ++r) srcs[r] = reqs[r]->send;
      b.Reduce(srcs.data(), n, &reqs[r0.root]->recv, 1, c);
      break;
    case OpKind::kReduceScatter:
      for (uint32_t r = 0; r < n; ++r) {
        for (uint32_t j = 0; j < n; ++j) srcs[j] = reqs[j]->send + r * seg;
        b.Reduce(srcs.data(), n, &reqs[r]->recv, 1, c);
      }
      break;
    case OpKind::kBroadcast:
      for (uint32_t r = 0; r < n; ++r) {
        srcs[r] = reqs[r0.root]->send;
        dsts[r] = reqs[r]->recv;
      }
      b.Copy(srcs.data(), dsts.data(), n, seg);
      break;
    case OpKind::kAllGather:
      for (uint32_t j = 0; j < n; ++j) {
        for (uint32_t r = 0; r < n; ++r) {
          srcs[r] = reqs[j]->send;
          dsts[r] = reqs[r]->recv + j * seg;
        }
        b.Copy(srcs.data(), dsts.data(), n, seg);
      }
      break;
    case OpKind::kAllToAll:
    case OpKind::kAllToAllv:
      PlanAllToAll(reqs, esize, b);
      break;
    case OpKind::kBarrier:
    case OpKind::kSend:
    case OpKind::kRecv:
      break;
  }
}

void BuildCopyPlan(std::byte* src, std::byte* dst, uint64_t bytes, size_t chunk_bytes,
                   LocalPlan* plan, int device) {
  plan->Clear();
  plan->device = device;
  if (device >= 0) chunk_bytes = kDeviceChunkBytes;
  PlanBuilder b(plan, chunk_bytes, 1);
  b.Copy(&src, &dst, 1, bytes);
}

void RunStep(const LocalPlan& plan, size_t i) {
  const LocalStep& s = plan.steps[i];
  std::byte* const* srcs = plan.ptrs.data() + s.src_begin;
  std::byte* const* dsts = plan.ptrs.data() + s.dst_begin;
  switch (s.kind) {
    case LocalStep::Kind::kReduce:
      kernels::ReduceToMany(plan.dtype, plan.red_op, reinterpret_cast<void* const*>(dsts),
                            static_cast<int>(s.ndsts), reinterpret_cast<const void* const*>(srcs),
                            static_cast<int>(s.nsrcs), s.count, plan.avg_divisor);
      break;
    case LocalStep::Kind::kCopy:
      for (uint32_t k = 0; k < s.nsrcs; ++k) kernels::Copy(dsts[k], srcs[k], s.count);
      break;
    case LocalStep::Kind::kSwap:
      kernels::Swap(srcs[0], dsts[0], s.count);
      break;
  }
}

namespace {

// One reduce step on a device, of any number of sources and destinations. The runtime takes at
// most kMaxPointers of each per launch (the kernel's arguments are fixed arrays), so a wider one
// (more local ranks than that) runs as passes into one accumulating destination, then copies of
// it into the others. The accumulator is a destination that no source of a later pass overlaps
// (the sources it overlaps, its own input in place, go in the first pass); between passes an
// average sums, and divides only in the last. Passes round float16/bfloat16 to their width
// between them (a single launch accumulates in float32 throughout).
absl::Status ReduceOnDevice(device::DeviceRuntime* devices, int dev, const LocalPlan& plan,
                            std::byte* const* dsts, int ndsts, std::byte* const* srcs, int nsrcs,
                            size_t count) {
  constexpr int kMax = device::DeviceRuntime::kMaxPointers;
  if (nsrcs <= kMax && ndsts <= kMax) {
    return devices->ReduceToMany(dev, plan.dtype, plan.red_op, reinterpret_cast<void* const*>(dsts),
                                 ndsts, reinterpret_cast<const void* const*>(srcs), nsrcs, count,
                                 plan.avg_divisor);
  }
  const size_t bytes = count * kernels::ElementSize(plan.dtype);
  auto overlap = [bytes](const std::byte* a, const std::byte* b) {
    return a < b + bytes && b < a + bytes;
  };
  int acc = -1;
  std::vector<const void*> order;
  for (int d = 0; d < ndsts && acc < 0; ++d) {
    order.clear();
    for (int k = 0; k < nsrcs; ++k) {
      if (overlap(dsts[d], srcs[k])) order.push_back(srcs[k]);
    }
    if (static_cast<int>(order.size()) <= kMax) acc = d;
  }
  if (acc < 0) {
    return absl::InternalError(absl::StrCat("no destination of a ", nsrcs,
                                            "-source reduce is "
                                            "overlapped by at most ",
                                            kMax, " of its sources"));
  }
  for (int k = 0; k < nsrcs; ++k) {
    if (!overlap(dsts[acc], srcs[k])) order.push_back(srcs[k]);
  }
  void* const out[1] = {dsts[acc]};
  const kernels::RedOp partial =
      plan.red_op == kernels::RedOp::kAvg ? kernels::RedOp::kSum : plan.red_op;
  std::vector<const void*> pass;
  size_t next = 0;
  while (next < order.size()) {
    pass.clear();
    if (next > 0) pass.push_back(dsts[acc]);  // what the passes before summed
    while (next < order.size() && static_cast<int>(pass.size()) < kMax)
      pass.push_back(order[next++]);
    const bool last = next == order.size();
    if (absl::Status s = devices->ReduceToMany(dev, plan.dtype, last ? plan.red_op : partial, out,
                                               1, pass.data(), static_cast<int>(pass.size()), count,
                                               last ? plan.avg_divisor : 1);
        !s.ok()) {
      return s;
    }
  }
  for (int d = 0; d < ndsts; ++d) {
    if (d == acc) continue;
    if (absl::Status s = devices->Copy(dev, dsts[d], dsts[acc], bytes); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// The devices that run a step, in the order they first appear: a reduce's is every destination's
// device (each takes a slice of the elements), a copy's its first destination's, a swap's its
// first region's. Each must reach every pointer of the step (its own memory or a peer's).
absl::StatusOr<std::vector<int>> StepDevices(const LocalStep& s, std::byte* const* srcs,
                                             std::byte* const* dsts,
                                             device::DeviceRuntime* devices) {
  std::vector<int> run;
  auto device_of = [&](const std::byte* p) -> absl::StatusOr<int> {
    const int d = devices->DeviceOf(p);
    if (d < 0) {
      return absl::InternalError(absl::StrCat("pointer ", absl::Hex(reinterpret_cast<uintptr_t>(p)),
                                              " of a device plan is not device memory"));
    }
    return d;
  };
  const uint32_t nrun = s.kind == LocalStep::Kind::kReduce ? s.ndsts : 1;
  std::byte* const* runners = s.kind == LocalStep::Kind::kSwap ? srcs : dsts;
  for (uint32_t k = 0; k < nrun; ++k) {
    absl::StatusOr<int> d = device_of(runners[k]);
    if (!d.ok()) return d.status();
    if (std::find(run.begin(), run.end(), *d) == run.end()) run.push_back(*d);
  }
  auto check = [&](std::byte* const* ptrs, uint32_t n) -> absl::Status {
    for (uint32_t k = 0; k < n; ++k) {
      absl::StatusOr<int> d = device_of(ptrs[k]);
      if (!d.ok()) return d.status();
      for (int e : run) {
        if (!devices->CanAccessPeer(e, *d)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "device ", e, " cannot reach memory of device ", *d,
              " (no peer access between them): an operation over ranks on several devices needs "
              "peer access (NVLink or PCIe P2P) between them"));
        }
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status st = check(srcs, s.nsrcs); !st.ok()) return st;
  if (absl::Status st = check(dsts, s.ndsts); !st.ok()) return st;
  return run;
}

}  // namespace

absl::Status RunDeviceSteps(const LocalPlan& plan, device::DeviceRuntime* devices) {
  absl::Status first;
  // Devices with launches not yet waited for. Launches on one device run in order on its stream;
  // across devices nothing orders them, so before a step that runs on other devices than the one
  // before it, or is split across several, what came before is waited for (a fused group's later
  // operation may read what an earlier one wrote).
  std::vector<int> pending;
  auto wait_all = [&]() {
    for (int d : pending) {
      absl::Status synced = devices->Synchronize(d);
      if (first.ok() && !synced.ok()) {
        first = absl::Status(synced.code(), absl::StrCat("device ", d, ": ", synced.message()));
      }
    }
    pending.clear();
  };
  std::vector<std::byte*> part_srcs, part_dsts;
  for (size_t i = 0; i < plan.steps.size() && first.ok(); ++i) {
    const LocalStep& s = plan.steps[i];
    std::byte* const* srcs = plan.ptrs.data() + s.src_begin;
    std::byte* const* dsts = plan.ptrs.data() + s.dst_begin;
    absl::StatusOr<std::vector<int>> run = StepDevices(s, srcs, dsts, devices);
    if (!run.ok()) {
      first = absl::Status(run.status().code(), absl::StrCat("step ", i, " of ", plan.steps.size(),
                                                             ": ", run.status().message()));
      break;
    }
    if (!pending.empty() && (run->size() > 1 || *run != pending)) wait_all();
    if (!first.ok()) break;
    const int dev = run->front();
    switch (s.kind) {
      case LocalStep::Kind::kReduce: {
        // Device k of n reduces elements [k*count/n, (k+1)*count/n) (cut at multiples of 64
        // elements, so that vector loads stay aligned) into every destination.
        const size_t n = run->size();
        const size_t esize = kernels::ElementSize(plan.dtype);
        for (size_t k = 0; k < n && first.ok(); ++k) {
          auto cut = [&](size_t j) { return j == n ? s.count : s.count * j / n / 64 * 64; };
          const size_t lo = cut(k), hi = cut(k + 1);
          if (hi <= lo) continue;
          part_srcs.assign(srcs, srcs + s.nsrcs);
          part_dsts.assign(dsts, dsts + s.ndsts);
          for (auto& p : part_srcs) p += lo * esize;
          for (auto& p : part_dsts) p += lo * esize;
          first =
              ReduceOnDevice(devices, (*run)[k], plan, part_dsts.data(), static_cast<int>(s.ndsts),
                             part_srcs.data(), static_cast<int>(s.nsrcs), hi - lo);
        }
        break;
      }
      case LocalStep::Kind::kCopy:
        for (uint32_t k = 0; k < s.nsrcs && first.ok(); ++k) {
          first = devices->Copy(dev, dsts[k], srcs[k], s.count);
        }
        break;
      case LocalStep::Kind::kSwap:
        first = devices->Swap(dev, srcs[0], dsts[0], s.count);
        break;
    }
    for (int d : *run) {
      if (std::find(pending.begin(), pending.end(), d) == pending.end()) pending.push_back(d);
    }
    if (!first.ok()) {
      first = absl::Status(first.code(), absl::StrCat("step ", i, " of ", plan.steps.size(),
                                                      " on device ", dev, ": ", first.message()));
    }
  }
  // Wait for what was enqueued even after a failed launch: nothing may still run on the buffers
  // once the operation completes.
  wait_all();
  return first;
}

}  // namespace railyard::scheduler
