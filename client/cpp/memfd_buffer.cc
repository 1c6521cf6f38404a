#include "memfd_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace railyard::internal {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what) {
  std::string message = absl::StrCat(what, ": ", ErrnoText(err));
  if (err == ENOSPC || err == ENOMEM || err == EMFILE || err == ENFILE) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

}  // namespace

absl::StatusOr<MemfdBuffer> CreateMemfdBuffer(const std::string& job, size_t size) {
  if (size == 0) return absl::InvalidArgumentError("cannot allocate a buffer of 0 bytes");
  MemfdBuffer b;
  const std::string name = absl::StrCat("railyard.", job).substr(0, 200);
  b.fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (b.fd < 0) return ErrnoStatus(errno, "memfd_create");
  // fallocate reserves the pages now, so a full memory cgroup fails here with ENOSPC/ENOMEM
  // instead of a SIGBUS on first touch, and the daemon's pre-fault allocates nothing.
  if (fallocate(b.fd, 0, 0, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    CloseMemfd(&b);
    return ErrnoStatus(err, absl::StrCat("allocating a ", size, "-byte buffer"));
  }
  if (fcntl(b.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    CloseMemfd(&b);
    return ErrnoStatus(err, "sealing the buffer's memfd");
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, b.fd, 0);
  if (data == MAP_FAILED) {
    const int err = errno;
    CloseMemfd(&b);
    return ErrnoStatus(err, absl::StrCat("mmap of a ", size, "-byte buffer"));
  }
  b.data = data;
  b.size = size;
  return b;
}

void CloseMemfd(MemfdBuffer* buffer) {
  if (buffer->fd >= 0) close(buffer->fd);
  buffer->fd = -1;
}

std::string ErrnoText(int err) {
  char buffer[256];
  return strerror_r(err, buffer, sizeof(buffer));  // the GNU variant returns the text
}

void UnmapBuffer(void* data, size_t size) {
  if (data != nullptr && size > 0) munmap(data, size);
}

}  // namespace railyard::internal
