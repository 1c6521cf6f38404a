#include "daemon/submit/device_staging.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace railyard {
namespace {

using Region = HostStaging::Region;

// Completes a staged request: copies its recv region back to the device on the device's thread,
// chunk_bytes per task, then posts to the client's sink. Pipelined (a gate, and a run that
// watches it: Watched()), it copies back what the run tells it was written, as it is written,
// and completes once the operation has and every copy back is done.
class StagedSink : public CompletionSink,
                   public scheduler::OutputWatcher,
                   public std::enable_shared_from_this<StagedSink> {
 public:
  StagedSink(std::weak_ptr<CompletionSink> client, std::shared_ptr<HostStaging> staging,
             std::shared_ptr<scheduler::FillGate> gate, std::shared_ptr<MappedSegment> send_segment,
             std::shared_ptr<MappedSegment> recv_segment, device::DeviceRuntime* devices,
             scheduler::Executor* executor, std::shared_ptr<CompletionSink> keep,
             uint64_t chunk_bytes)
      : client_(std::move(client)),
        keep_(std::move(keep)),
        staging_(std::move(staging)),
        gate_(std::move(gate)),
        device_(staging_->device()),
        regions_(staging_->regions()),
        send_segment_(std::move(send_segment)),
        recv_segment_(std::move(recv_segment)),
        devices_(devices),
        executor_(executor),
        chunk_bytes_(chunk_bytes == 0 ? kStagingCopyChunk : chunk_bytes),
        written_(regions_.size()) {}

  void Watched() override { watched_.store(true, std::memory_order_release); }

  // On a run's thread: [p, p + n) of a recv region holds results (only bytes the operation wrote,
  // so nothing of a leased buffer's old contents). Written bytes gather into contiguous runs, and
  // a run goes back once it reaches chunk_bytes (the rest at the completion): one device copy per
  // chunk, not one per step (a 64 MiB operation has ~1000 steps; a device copy has a fixed cost).
  void Written(const std::byte* p, uint64_t n) override {
    std::vector<Piece> ready;
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < regions_.size(); ++i) {
        const Region& r = regions_[i];
        const std::byte* lo = std::max<const std::byte*>(p, r.host.data());
        const std::byte* hi = std::min<const std::byte*>(p + n, r.host.data() + r.bytes);
        if (!r.copy_back || lo >= hi) continue;
        auto [begin, end] = scheduler::AddRun(written_[i], lo - r.host.data(), hi - r.host.data());
        if (end - begin >= chunk_bytes_) {
          written_[i].erase(begin);
          ready.push_back({i, begin, end});
        }
      }
      CountLocked(ready);
    }
    Queue(ready);
  }
  void PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) override {
    if (watched_.load(std::memory_order_acquire)) {
      // Whatever the outcome, not before the copies back queued so far are done: the client may
      // reuse its buffer once it hears.
      bool now = false;
      std::vector<Piece> rest;
      {
        absl::MutexLock lock(&mu_);
        completed_ = true;
        request_id_ = request_id;
        seq_ = seq;
        if (!status.ok()) {
          outcome_ = status;
        } else {  // what is still gathering goes back now
          for (size_t i = 0; i < written_.size(); ++i) {
            for (const auto& [begin, end] : written_[i]) rest.push_back({i, begin, end});
            written_[i].clear();
          }
          CountLocked(rest);
        }
        now = pending_ == 0;
      }
      Queue(rest);
      if (now) Forward(request_id, Outcome(), seq);
      return;
    }
    if (!status.ok()) {
      Forward(request_id, status, seq);
      return;
    }
    if (gate_ == nullptr) {
      CopyBack(0, 0, request_id, seq);
      return;
    }
    // The operation may end before everything was copied in (it need not read every byte);
    // copying back a region the copy in has not reached would put a leased buffer's old bytes
    // (another tenant's) on the device.
    gate_->WhenFilled([self = shared_from_this(), request_id, seq](absl::Status filled) {
      if (!filled.ok()) return self->Forward(request_id, filled, seq);
      self->CopyBack(0, 0, request_id, seq);
    });
  }

 private:
  // The first (region, offset) at or after these with bytes to copy back; region ==
  // regions_.size() when none is left.
  void Skip(size_t* region, uint64_t* offset) const {
    while (*region < regions_.size() &&
           (!regions_[*region].copy_back || *offset >= regions_[*region].bytes)) {
      ++*region;
      *offset = 0;
    }
  }

  // One task: up to chunk_bytes_ from regions_[region] at offset, then the next task (behind
  // whatever else the device's thread has queued meanwhile), or, after the last, the completion.
  void CopyBack(size_t region, uint64_t offset, uint64_t request_id, uint64_t seq) {
    Skip(&region, &offset);
    if (region == regions_.size()) {  // nothing to copy back (a Reduce's non-root)
      Forward(request_id, absl::OkStatus(), seq);
      return;
    }
    executor_->PostToDevice(device_, [self = shared_from_this(), region, offset, request_id,
                                      seq]() mutable {
      const Region& r = self->regions_[region];
      const uint64_t n = std::min(self->chunk_bytes_, r.bytes - offset);
      absl::Status s = self->devices_->CopyFromHost(self->device_, r.device_ptr + offset,
                                                    r.host.data() + offset, n);
      if (!s.ok()) {
        self->Forward(
            request_id,
            absl::InternalError(absl::StrCat("copying the result back to device ", self->device_,
                                             " after the operation: ", s.message())),
            seq);
        return;
      }
      offset += n;
      self->Skip(&region, &offset);
      if (region == self->regions_.size()) {
        self->Forward(request_id, absl::OkStatus(), seq);
        return;
      }
      self->CopyBack(region, offset, request_id, seq);
    });
  }

  // The completion, once, after everything else this sink does. The host memory goes back to the
  // pool first (unless a copy in still runs, which holds it until it ends), so that the rank's
  // next operation, which may follow as soon as the client hears, can reuse it.
  void Forward(uint64_t request_id, const absl::Status& status, uint64_t seq) {
    std::shared_ptr<HostStaging> staging;
    {
      absl::MutexLock lock(&mu_);
      staging = std::move(staging_);
    }
    staging.reset();
    if (auto client = client_.lock()) client->PostCompletion(request_id, status, seq);
  }

  // Bytes [begin, end) of regions_[region] to copy back.
  struct Piece {
    size_t region;
    uint64_t begin;
    uint64_t end;
  };

  // Counts the device copies `pieces` take (chunk_bytes_ each at most) as pending.
  void CountLocked(const std::vector<Piece>& pieces) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Piece& piece : pieces) {
      pending_ += (piece.end - piece.begin + chunk_bytes_ - 1) / chunk_bytes_;
    }
  }

  // Posts the device copies CountLocked counted, a chunk per task.
  void Queue(const std::vector<Piece>& pieces) {
    for (const Piece& piece : pieces) {
      for (uint64_t off = piece.begin; off < piece.end;) {
        const uint64_t len = std::min(chunk_bytes_, piece.end - off);
        executor_->PostToDevice(device_, [self = shared_from_this(), i = piece.region, off, len] {
          const Region& r = self->regions_[i];
          absl::Status s = self->devices_->CopyFromHost(self->device_, r.device_ptr + off,
                                                        r.host.data() + off, len);
          self->CopiedBack(s);
        });
        off += len;
      }
    }
  }

  absl::Status Outcome() {
    absl::MutexLock lock(&mu_);
    return outcome_;
  }

  // A pipelined copy back is done; the last one after the completion forwards it.
  void CopiedBack(const absl::Status& s) {
    bool now = false;
    uint64_t id = 0, seq = 0;
    {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && outcome_.ok()) {
        outcome_ = absl::InternalError(
            absl::StrCat("copying a result back to device ", device_, ": ", s.message()));
      }
      now = --pending_ == 0 && completed_;
      id = request_id_;
      seq = seq_;
    }
    if (now) Forward(id, Outcome(), seq);
  }

  const std::weak_ptr<CompletionSink> client_;
  // The sink client_ points to when the request owned it (a stream sync's): it lives as long as
  // the copy back that comes before it.
  const std::shared_ptr<CompletionSink> keep_;
  // The host memory and its quota charge, until the copy back is done (Forward lets it go).
  std::shared_ptr<HostStaging> staging_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<scheduler::FillGate> gate_;  // null: copied in before the operation
  const int device_;
  const std::vector<Region>& regions_;  // staging_'s
  // The device memory stays mapped until the copy back is done.
  const std::shared_ptr<MappedSegment> send_segment_;
  const std::shared_ptr<MappedSegment> recv_segment_;
  device::DeviceRuntime* const devices_;
  scheduler::Executor* const executor_;
  const uint64_t chunk_bytes_;
  // Pipelined copies back (Watched, Written).
  std::atomic<bool> watched_{false};
  absl::Mutex mu_;
  uint64_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // copies back queued and not done
  // By region: written bytes not yet copied back, as disjoint runs [begin, end) keyed by begin.
  std::vector<std::map<uint64_t, uint64_t>> written_ ABSL_GUARDED_BY(mu_);
  bool completed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t request_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status outcome_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<HostStaging>> HostStaging::Prepare(const PendingRequest& request,
                                                                  int nranks,
                                                                  device::StagingPool* pool) {
  const scheduler::RankRequest& req = request.req;
  absl::StatusOr<scheduler::Extents> ext = scheduler::ComputeExtents(req, request.rank, nranks);
  if (!ext.ok()) return ext.status();
  const bool has_send = ext->needs_send && ext->send_bytes > 0 && req.send != nullptr;
  const bool has_recv = ext->needs_recv && ext->recv_bytes > 0 && req.recv != nullptr;
  std::unique_ptr<HostStaging> staging(new HostStaging());
  staging->device_ = req.device;
  staging->has_send_ = has_send;
  staging->has_recv_ = has_recv;
  std::vector<Region>& regions = staging->regions_;
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
  if (absl::Status s =
          QuotaCharge::Take(request.quota, Resource::kBufferBytes, total, &staging->charge_);
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
  }
  return staging;
}

std::shared_ptr<scheduler::FillGate> HostStaging::Gate() {
  if (gate_ == nullptr) {
    std::vector<scheduler::FillGate::Region> filled;
    gate_region_.assign(regions_.size(), 0);
    for (size_t i = 0; i < regions_.size(); ++i) {
      if (!regions_[i].copy_in) continue;
      gate_region_[i] = filled.size();
      filled.push_back({regions_[i].host.data(), regions_[i].bytes});
    }
    gate_ = std::make_shared<scheduler::FillGate>(std::move(filled));
  }
  return gate_;
}

absl::StatusOr<bool> HostStaging::CopyIn(device::DeviceRuntime* devices, uint64_t max_bytes) {
  // A leased buffer may hold an earlier operation's bytes (another tenant's): each region is
  // either copied in whole here or written whole by the operation before anything is copied back
  // (copy_in, Prepare), so none of them reaches the device.
  while (max_bytes > 0 && next_region_ < regions_.size()) {
    Region& r = regions_[next_region_];
    if (!r.copy_in || next_offset_ >= r.bytes) {
      ++next_region_;
      next_offset_ = 0;
      continue;
    }
    const uint64_t n = std::min(max_bytes, r.bytes - next_offset_);
    if (absl::Status s = devices->CopyToHost(device_, r.host.data() + next_offset_,
                                             r.device_ptr + next_offset_, n);
        !s.ok()) {
      absl::Status error = absl::InternalError(
          absl::StrCat("copying device ", device_,
                       " memory to host memory before the operation: ", s.message()));
      if (gate_ != nullptr) gate_->Fail(error);
      return error;
    }
    next_offset_ += n;
    max_bytes -= n;
    if (gate_ != nullptr) gate_->Advance(gate_region_[next_region_], next_offset_);
  }
  while (next_region_ < regions_.size() &&
         (!regions_[next_region_].copy_in || next_offset_ >= regions_[next_region_].bytes)) {
    ++next_region_;
    next_offset_ = 0;
  }
  return next_region_ == regions_.size();
}

void HostStaging::Attach(std::shared_ptr<HostStaging> staging, PendingRequest* request,
                         device::DeviceRuntime* devices, scheduler::Executor* executor,
                         uint64_t chunk_bytes) {
  scheduler::RankRequest& req = request->req;
  auto host_of = [&](std::byte* p) -> std::byte* {
    for (const Region& r : staging->regions_) {
      if (p >= r.device_ptr && p < r.device_ptr + r.bytes)
        return r.host.data() + (p - r.device_ptr);
    }
    return nullptr;
  };
  if (staging->has_send_) req.send = host_of(req.send);
  if (staging->has_recv_) req.recv = host_of(req.recv);
  req.device = -1;
  request->input_gate = staging->gate_;
  std::shared_ptr<scheduler::FillGate> gate = staging->gate_;
  auto sink = std::make_shared<StagedSink>(request->session, std::move(staging), std::move(gate),
                                           request->send_segment, request->recv_segment, devices,
                                           executor, std::move(request->sink_owner), chunk_bytes);
  if (request->input_gate != nullptr) request->output_watcher = sink;
  request->session = sink;
  request->sink_owner = std::move(sink);
}

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
                              device::StagingPool* pool, scheduler::Executor* executor,
                              uint64_t chunk_bytes) {
  absl::StatusOr<std::unique_ptr<HostStaging>> staging =
      HostStaging::Prepare(*request, nranks, pool);
  if (!staging.ok()) return staging.status();
  absl::StatusOr<bool> copied = (*staging)->CopyIn(devices, UINT64_MAX);
  if (!copied.ok()) return copied.status();
  HostStaging::Attach(*std::move(staging), request, devices, executor, chunk_bytes);
  return absl::OkStatus();
}

}  // namespace railyard
