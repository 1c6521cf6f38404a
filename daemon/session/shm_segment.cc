#include "daemon/session/shm_segment.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace railyard {
namespace {

// What the descriptor is, as /proc names it: "/memfd:x (deleted)", "/dev/shm/y", "socket:[1]".
std::string DescribeFd(int fd) {
  char link[256] = {};
  const std::string proc = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = ::readlink(proc.c_str(), link, sizeof(link) - 1);
  return n > 0 ? std::string(link, static_cast<size_t>(n)) : std::string("an unknown file");
}

std::string MissingSeals(int seals) {
  std::vector<const char*> missing;
  if ((seals & F_SEAL_SHRINK) == 0) missing.push_back("F_SEAL_SHRINK");
  if ((seals & F_SEAL_GROW) == 0) missing.push_back("F_SEAL_GROW");
  if ((seals & F_SEAL_SEAL) == 0) missing.push_back("F_SEAL_SEAL");
  return absl::StrJoin(missing, " | ");
}

}  // namespace

absl::StatusOr<std::shared_ptr<MappedSegment>> MappedSegment::MapMemfd(UniqueFd fd, uint64_t size) {
  static_assert(kRequiredSeals == (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
  if (size == 0) return absl::InvalidArgumentError("buffer size must be > 0");
  const std::string what = DescribeFd(fd.get());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the descriptor is ", what, ", not a memfd: create buffers with memfd_create"));
  }
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the descriptor is ", what,
        ", which cannot be sealed: buffers are memfds created with MFD_ALLOW_SEALING"));
  }
  if ((seals & kRequiredSeals) != kRequiredSeals) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the memfd ", what, " lacks ", MissingSeals(seals),
        ": seal it with F_ADD_SEALS(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) before sending, so "
        "that it can never shrink under the daemon"));
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the memfd ", what, " is sealed against writes; the daemon writes results"));
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError(
        absl::StrCat("the descriptor of ", what, " is not open read-write"));
  }
  if (static_cast<uint64_t>(st.st_size) < size) {
    return absl::FailedPreconditionError(absl::StrCat("the memfd ", what, " is ", st.st_size,
                                                      " bytes, smaller than the ", size,
                                                      " bytes to register"));
  }
  // Pages the client never allocated would be allocated (and charged) to the daemon by the
  // pre-fault below: refuse sparse buffers. hugetlbfs does not count blocks the same way.
  struct statfs fs {};
  const bool hugetlb = ::fstatfs(fd.get(), &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t need = (size + page - 1) / page * page;
  if (!hugetlb && static_cast<uint64_t>(st.st_blocks) * 512 < need) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the memfd ", what, " has ", static_cast<uint64_t>(st.st_blocks) * 512, " of its ", size,
        " bytes allocated: allocate it (fallocate) before registering"));
  }
  // MAP_POPULATE pre-faults the daemon's page tables now, not on the first collective.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  const int err = errno;
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", size, " bytes of ", what, " failed: ", std::strerror(err)));
  }
  return std::shared_ptr<MappedSegment>(new MappedSegment(what, static_cast<std::byte*>(p), size));
}

std::shared_ptr<MappedSegment> MappedSegment::FromDevice(
    std::shared_ptr<device::DeviceMapping> mapping) {
  auto seg = std::shared_ptr<MappedSegment>(new MappedSegment(
      absl::StrCat("device ", mapping->device(), " memory"), mapping->data(), mapping->size()));
  seg->device_ = std::move(mapping);
  return seg;
}

MappedSegment::~MappedSegment() {
  // Device memory: the mapping unmaps itself; a part: its parent's mapping is unmapped with it.
  if (device_ == nullptr && parent_ == nullptr) ::munmap(data_, size_);
}

absl::StatusOr<std::shared_ptr<MappedSegment>> MappedSegment::PartOf(
    std::shared_ptr<MappedSegment> parent, uint64_t offset, uint64_t size) {
  if (parent->on_device()) {
    return absl::InvalidArgumentError("a part of a buffer must be of host memory, not device");
  }
  if (size == 0) return absl::InvalidArgumentError("a part of a buffer must have bytes");
  if (offset > parent->size() || size > parent->size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat("part [", offset, ", ", offset + size,
                                                   ") runs past the end of the ", parent->size(),
                                                   "-byte buffer"));
  }
  std::shared_ptr<MappedSegment> part(
      new MappedSegment(parent->name_, parent->data_ + offset, size));
  part->parent_ = std::move(parent);
  return part;
}

absl::Status MappedSegment::CheckResident(uint64_t offset, uint64_t bytes) const {
  if (on_device() || bytes == 0 || data_ == nullptr) return absl::OkStatus();
  static const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  // Pages by address: a part of a buffer need not start on a page.
  const uintptr_t from = reinterpret_cast<uintptr_t>(data_) + offset;
  const uintptr_t first = from / kPage * kPage;
  const uintptr_t last = (from + bytes + kPage - 1) / kPage * kPage;
  // A page's vector entry per page; in slices, so a large buffer needs no large vector.
  constexpr uint64_t kSlicePages = 4096;
  unsigned char vec[kSlicePages];
  for (uintptr_t at = first; at < last; at += kSlicePages * kPage) {
    const uint64_t len = std::min<uint64_t>(last - at, kSlicePages * kPage);
    if (::mincore(reinterpret_cast<void*>(at), len, vec) != 0) {
      return absl::InternalError(absl::StrCat("mincore on the buffer: ", std::strerror(errno)));
    }
    for (uint64_t p = 0; p < len / kPage; ++p) {
      if ((vec[p] & 1) == 0) {
        const uintptr_t page = std::max<uintptr_t>(at + p * kPage, from);
        return absl::FailedPreconditionError(absl::StrCat(
            "byte ", page - reinterpret_cast<uintptr_t>(data_), " of the ", size_,
            "-byte buffer has no memory behind it: "
            "its pages were released after registering (a hole punched in the memfd, or "
            "MADV_REMOVE; or swapped out). railyardd does not fault a client's pages in on its "
            "own account: write the buffer (or register a new one) before using it"));
      }
    }
  }
  return absl::OkStatus();
}

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
