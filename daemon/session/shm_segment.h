// A client's buffer mapped into the daemon (zero copy): a memfd the client created, sized and
// sealed, and passed over the side channel (proto/railyard/v1/fd_channel.h). Never a name:
// nothing another process could open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/device/device_runtime.h"
#include "daemon/session/quota.h"
#include "daemon/util/unique_fd.h"

namespace railyard {

class MappedSegment {
 public:
  // The seals a buffer must carry: it can never shrink (no SIGBUS in the daemon), grow, or lose
  // its seals.
  static constexpr int kRequiredSeals = 0x0002 | 0x0004 | 0x0001;  // SHRINK | GROW | SEAL

  // Checks that fd is a memfd open read-write with kRequiredSeals and without write seals, at
  // least `size` bytes long and backed by memory already allocated (so the daemon's pre-fault
  // allocates nothing), then maps `size` bytes read-write, pre-faulted (MAP_POPULATE).
  // INVALID_ARGUMENT for size 0 or a descriptor that is not such a memfd (saying what it is and
  // which seal is missing); FAILED_PRECONDITION when it is smaller than size or not allocated;
  // RESOURCE_EXHAUSTED when mmap fails. The descriptor is closed either way.
  static absl::StatusOr<std::shared_ptr<MappedSegment>> MapMemfd(UniqueFd fd, uint64_t size);

  // A client's device memory the daemon imported (device::DeviceRuntime::Import): data() is then
  // a device address, which host code must never dereference (on_device() says so).
  static std::shared_ptr<MappedSegment> FromDevice(std::shared_ptr<device::DeviceMapping> mapping);
  // [offset, offset + size) of a host segment, as a segment of its own that keeps `parent`
  // mapped (Local.RegisterBuffer's parent_buffer_id). INVALID_ARGUMENT for device memory, an
  // empty part or one past the parent's end.
  static absl::StatusOr<std::shared_ptr<MappedSegment>> PartOf(
      std::shared_ptr<MappedSegment> parent, uint64_t offset, uint64_t size);

  ~MappedSegment();
  MappedSegment(const MappedSegment&) = delete;
  MappedSegment& operator=(const MappedSegment&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // What /proc says the descriptor was ("/memfd:railyard.<job> (deleted)"), for logs and errors.
  const std::string& name() const { return name_; }
  // The CUDA device ordinal of device memory; -1 for host memory.
  int device() const { return device_ == nullptr ? -1 : device_->device(); }
  bool on_device() const { return device_ != nullptr; }

  // The quota this mapping holds (count and bytes), given back when it is unmapped: after its
  // session released it and the last operation using it let go.
  void HoldCharges(QuotaCharge count, QuotaCharge bytes) {
    count_charge_ = std::move(count);
    bytes_charge_ = std::move(bytes);
  }
  // Its place in the daemon's mapping budget (mapping_budget.h), given back after the munmap.
  void HoldMapping(std::shared_ptr<void> mapping) { mapping_charge_ = std::move(mapping); }

  // Checks that [offset, offset + bytes) lies inside the segment and offset is a multiple of
  // align. INVALID_ARGUMENT saying by how much otherwise.
  absl::Status CheckRange(uint64_t offset, uint64_t bytes, size_t align) const;
  // FAILED_PRECONDITION naming the first page of [offset, offset + bytes) that has no page in
  // memory (mincore): the client released it (a hole punched in its memfd, MADV_REMOVE) after
  // registering. The daemon would fault it back in, on its own account and not the tenant's,
  // so it refuses instead. Host memory only (OK for device memory); the range was checked.
  absl::Status CheckResident(uint64_t offset, uint64_t bytes) const;

 private:
  MappedSegment(std::string name, std::byte* data, uint64_t size)
      : name_(std::move(name)), data_(data), size_(size) {}

  std::string name_;
  std::shared_ptr<device::DeviceMapping> device_;  // null for host memory
  std::byte* data_;
  uint64_t size_;
  QuotaCharge count_charge_;
  QuotaCharge bytes_charge_;
  std::shared_ptr<void> mapping_charge_;
  std::shared_ptr<MappedSegment> parent_;  // a part: the segment whose mapping it is in
};

}  // namespace railyard
