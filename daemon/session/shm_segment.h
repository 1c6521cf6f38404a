// A client's POSIX shared-memory segment mapped into the daemon (zero copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace railyard {

class MappedSegment {
 public:
  // Opens and maps shm object `name` read-write, pre-faulted (MAP_POPULATE). Errors:
  // INVALID_ARGUMENT for a name outside "/railyard.[A-Za-z0-9._-]+" or size 0,
  // NOT_FOUND when it does not exist, FAILED_PRECONDITION when it is not a regular segment or is
  // smaller than size, RESOURCE_EXHAUSTED when mmap fails.
  static absl::StatusOr<std::shared_ptr<MappedSegment>> Map(absl::string_view name, uint64_t size);

  ~MappedSegment();
  MappedSegment(const MappedSegment&) = delete;
  MappedSegment& operator=(const MappedSegment&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

  // Checks that [offset, offset + bytes) lies inside the segment and offset is a multiple of
  // align. INVALID_ARGUMENT saying by how much otherwise.
  absl::Status CheckRange(uint64_t offset, uint64_t bytes, size_t align) const;

 private:
  MappedSegment(std::string name, std::byte* data, uint64_t size)
      : name_(std::move(name)), data_(data), size_(size) {}

  std::string name_;
  std::byte* data_;
  uint64_t size_;
};

}  // namespace railyard
