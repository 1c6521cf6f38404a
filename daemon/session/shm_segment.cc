#include "daemon/session/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace railyard {
namespace {

constexpr absl::string_view kPrefix = "/railyard.";
constexpr size_t kMaxNameLength = 200;

bool ValidName(absl::string_view name) {
  if (name.size() <= kPrefix.size() || name.size() > kMaxNameLength) return false;
  if (name.substr(0, kPrefix.size()) != kPrefix) return false;
  for (char c : name.substr(1)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return name.find("..") == absl::string_view::npos;
}

}  // namespace

absl::StatusOr<std::shared_ptr<MappedSegment>> MappedSegment::Map(absl::string_view name,
                                                                  uint64_t size) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm name '", name.substr(0, 64),
                     "' is not of the form /railyard.[A-Za-z0-9._-]+ (at most ", kMaxNameLength,
                     " characters)"));
  }
  if (size == 0) return absl::InvalidArgumentError("buffer size must be > 0");
  const std::string n(name);
  const int fd = ::shm_open(n.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("shm segment ", n, " does not exist"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat("cannot open shm segment ", n, ": ", std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(n, " is not a shared-memory segment"));
  }
  if (static_cast<uint64_t>(st.st_size) < size) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat("shm segment ", n, " is ", st.st_size,
                                                      " bytes, smaller than the ", size,
                                                      " bytes to register"));
  }
  // MAP_POPULATE pre-faults the daemon's page tables now, not on the first collective.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", size, " bytes of ", n, " failed: ", std::strerror(err)));
  }
  return std::shared_ptr<MappedSegment>(new MappedSegment(n, static_cast<std::byte*>(p), size));
}

MappedSegment::~MappedSegment() { ::munmap(data_, size_); }

absl::Status MappedSegment::CheckRange(uint64_t offset, uint64_t bytes, size_t align) const {
  if (align > 1 && offset % align != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset ", offset, " is not a multiple of the element size ", align));
  }
  if (offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("region [", offset, ", ", offset + bytes, ") runs past the end of the ", size_,
                     "-byte buffer by ", offset + bytes - size_, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace railyard
