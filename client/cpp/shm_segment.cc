#include "shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace railyard::internal {
namespace {

// 64 random bits as 16 hex digits: makes the name unguessable, so no other process can race us to
// create or open it between shm_open and shm_unlink.
std::string RandomHex16() {
  uint64_t bits = 0;
  size_t got = 0;
  auto* out = reinterpret_cast<unsigned char*>(&bits);
  while (got < sizeof(bits)) {
    ssize_t n = getrandom(out + got, sizeof(bits) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;  // cannot happen on Linux >= 3.17; fall back to weaker bits below
    }
    got += static_cast<size_t>(n);
  }
  if (got < sizeof(bits)) {
    bits ^= reinterpret_cast<uintptr_t>(&bits) * 0x9E3779B97F4A7C15ull ^
            static_cast<uint64_t>(getpid());
  }
  return absl::StrFormat("%016x", bits);
}

absl::Status ErrnoStatus(int err, const std::string& what) {
  std::string message = absl::StrCat(what, ": ", ErrnoText(err));
  if (err == ENOSPC || err == ENOMEM || err == EMFILE || err == ENFILE) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

}  // namespace

absl::StatusOr<ShmSegment> CreateShmSegment(const std::string& job, uint64_t serial, size_t size) {
  if (size == 0) return absl::InvalidArgumentError("cannot allocate a buffer of 0 bytes");
  ShmSegment segment;
  segment.name = absl::StrCat("/railyard.", job, ".", getpid(), ".", serial, ".", RandomHex16());
  segment.size = size;

  int fd = shm_open(segment.name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open(", segment.name, ")"));
  // posix_fallocate reserves the pages, so a full /dev/shm fails here with ENOSPC instead of
  // killing the process with SIGBUS on first touch.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err == EINVAL || err == EOPNOTSUPP) {
    err = ftruncate(fd, static_cast<off_t>(size)) == 0 ? 0 : errno;
  }
  if (err != 0) {
    close(fd);
    shm_unlink(segment.name.c_str());
    return ErrnoStatus(err,
                       absl::StrCat("sizing shared memory ", segment.name, " to ", size, " bytes"));
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  err = errno;
  close(fd);
  if (data == MAP_FAILED) {
    shm_unlink(segment.name.c_str());
    return ErrnoStatus(err, absl::StrCat("mmap of ", size, " bytes of ", segment.name));
  }
  segment.data = data;
  return segment;
}

void UnlinkShmSegment(const ShmSegment& segment) {
  if (!segment.name.empty()) shm_unlink(segment.name.c_str());
}

std::string ErrnoText(int err) {
  char buffer[256];
  return strerror_r(err, buffer, sizeof(buffer));  // the GNU variant returns the text
}

void UnmapShm(void* data, size_t size) {
  if (data != nullptr && size > 0) munmap(data, size);
}

}  // namespace railyard::internal
