#include "daemon/comm/device_staging.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace railyard {
namespace {

struct Region {
  std::byte* device_ptr = nullptr;
  uint64_t bytes = 0;
  device::StagingPool::Lease host;  // its first `bytes` bytes
  bool copy_in = false;             // holds the send region, or bytes the operation may not write
  bool copy_back = false;           // holds (part of) the recv region
};

// Completes a staged request: copies its recv region back to the device on a worker, then posts
// to the client's sink.
class StagedSink : public CompletionSink, public std::enable_shared_from_this<StagedSink> {
 public:
  StagedSink(std::weak_ptr<CompletionSink> client, int device, std::vector<Region> regions,
             std::shared_ptr<MappedSegment> send_segment,
             std::shared_ptr<MappedSegment> recv_segment, QuotaCharge charge,
             device::DeviceRuntime* devices, scheduler::Executor* executor,
             std::shared_ptr<CompletionSink> keep)
      : client_(std::move(client)),
        keep_(std::move(keep)),
        device_(device),
        regions_(std::move(regions)),
        send_segment_(std::move(send_segment)),
        recv_segment_(std::move(recv_segment)),
        charge_(std::move(charge)),
        devices_(devices),
        executor_(executor) {}

  void PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) override {
    if (!status.ok()) {
      Forward(request_id, status, seq);
      return;
    }
    executor_->PostToDevice(device_, [self = shared_from_this(), request_id, seq] {
      absl::Status s;
      for (const Region& r : self->regions_) {
        if (!r.copy_back || !s.ok()) continue;
        s = self->devices_->CopyFromHost(self->device_, r.device_ptr, r.host.data(), r.bytes);
        if (!s.ok()) {
          s = absl::InternalError(absl::StrCat("copying the result back to device ", self->device_,
                                               " after the operation: ", s.message()));
        }
      }
      self->Forward(request_id, s, seq);
    });
  }

 private:
  void Forward(uint64_t request_id, const absl::Status& status, uint64_t seq) {
    if (auto client = client_.lock()) client->PostCompletion(request_id, status, seq);
  }

  const std::weak_ptr<CompletionSink> client_;
  // The sink client_ points to when the request owned it (a stream sync's): it lives as long as
  // the copy back that comes before it.
  const std::shared_ptr<CompletionSink> keep_;
  const int device_;
  const std::vector<Region> regions_;
  // The device memory stays mapped until the copy back is done.
  const std::shared_ptr<MappedSegment> send_segment_;
  const std::shared_ptr<MappedSegment> recv_segment_;
  QuotaCharge charge_;
  device::DeviceRuntime* const devices_;
  scheduler::Executor* const executor_;
};

}  // namespace

uint64_t StagedBytes(const PendingRequest& request, int nranks) {
  absl::StatusOr<scheduler::Extents> ext =
      scheduler::ComputeExtents(request.req, request.rank, nranks);
  if (!ext.ok()) return 0;
  uint64_t bytes = 0;
  if (ext->needs_send && request.req.send != nullptr) bytes += ext->send_bytes;
  if (ext->needs_recv && request.req.recv != nullptr) bytes += ext->recv_bytes;
  return bytes;
}

absl::Status StageThroughHost(PendingRequest* request, int nranks, device::DeviceRuntime* devices,
                              device::StagingPool* pool, scheduler::Executor* executor) {
  scheduler::RankRequest& req = request->req;
  const int device = req.device;
  absl::StatusOr<scheduler::Extents> ext = scheduler::ComputeExtents(req, request->rank, nranks);
  if (!ext.ok()) return ext.status();
  const bool has_send = ext->needs_send && ext->send_bytes > 0 && req.send != nullptr;
  const bool has_recv = ext->needs_recv && ext->recv_bytes > 0 && req.recv != nullptr;
  std::vector<Region> regions;
  auto add = [&](std::byte* p, uint64_t bytes, bool in, bool back) {
    Region r;
    r.device_ptr = p;
    r.bytes = bytes;
    r.copy_in = in;
    r.copy_back = back;
    regions.push_back(std::move(r));
  };
  const bool overlap = has_send && has_recv && req.send < req.recv + ext->recv_bytes &&
                       req.recv < req.send + ext->send_bytes;
  if (overlap) {  // in place: one copy of the union keeps send and recv where they were
    std::byte* lo = std::min(req.send, req.recv);
    std::byte* hi = std::max(req.send + ext->send_bytes, req.recv + ext->recv_bytes);
    add(lo, static_cast<uint64_t>(hi - lo), true, true);
  } else {
    if (has_send) add(req.send, ext->send_bytes, true, false);
    // The recv region is copied in only when the operation may leave some of it unwritten
    // (AllToAllv's unreceived blocks): what it does not write must come back as it was. Every
    // other operation writes all of its recv region (ComputeExtents'; a Reduce's non-root has
    // none) when it succeeds, and after a failure nothing is copied back.
    if (has_recv) add(req.recv, ext->recv_bytes, req.op == scheduler::OpKind::kAllToAllv, true);
  }
  uint64_t total = 0;
  for (const Region& r : regions) total += r.bytes;
  QuotaCharge charge;
  if (absl::Status s = QuotaCharge::Take(request->quota, Resource::kBufferBytes, total, &charge);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("staging ", total,
                                               " bytes of device memory in host "
                                               "memory for an operation across nodes: ",
                                               s.message()));
  }
  for (Region& r : regions) {
    absl::StatusOr<device::StagingPool::Lease> host = pool->Take(r.bytes);
    if (!host.ok()) return host.status();
    r.host = *std::move(host);
    // A leased buffer may hold an earlier operation's bytes (another tenant's): the region is
    // either copied in whole here or written whole by the operation before anything is copied
    // back (copy_in above), so none of them reaches the device.
    if (!r.copy_in) continue;
    if (absl::Status s = devices->CopyToHost(device, r.host.data(), r.device_ptr, r.bytes);
        !s.ok()) {
      return absl::InternalError(absl::StrCat(
          "copying device ", device, " memory to host memory before the operation: ", s.message()));
    }
  }
  auto host_of = [&](std::byte* p) -> std::byte* {
    for (const Region& r : regions) {
      if (p >= r.device_ptr && p < r.device_ptr + r.bytes)
        return r.host.data() + (p - r.device_ptr);
    }
    return nullptr;
  };
  if (has_send) req.send = host_of(req.send);
  if (has_recv) req.recv = host_of(req.recv);
  req.device = -1;
  auto sink = std::make_shared<StagedSink>(
      request->session, device, std::move(regions), request->send_segment, request->recv_segment,
      std::move(charge), devices, executor, std::move(request->sink_owner));
  request->session = sink;
  request->sink_owner = std::move(sink);
  return absl::OkStatus();
}

}  // namespace railyard
