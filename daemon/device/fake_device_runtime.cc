#include "daemon/device/fake_device_runtime.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/kernels/reduce.h"

namespace railyard::device {

// [offset, offset + size) of a fake allocation; both of its mappings start at the allocation's
// base (mmap offsets must be page-aligned, a registered offset need not be).
class FakeDeviceRuntime::Mapping : public DeviceMapping {
 public:
  Mapping(std::shared_ptr<Regions> regions, std::byte* device_base, std::byte* host_base,
          uint64_t mapped, uint64_t offset, uint64_t size, int device)
      : regions_(std::move(regions)),
        device_base_(device_base),
        host_base_(host_base),
        mapped_(mapped),
        offset_(offset),
        size_(size),
        device_(device) {}
  ~Mapping() override {
    {
      absl::MutexLock lock(&regions_->mu);
      regions_->by_address.erase(device_base_ + offset_);
    }
    ::munmap(host_base_, mapped_);
    ::munmap(device_base_, mapped_);
  }
  std::byte* data() const override { return device_base_ + offset_; }
  uint64_t size() const override { return size_; }
  int device() const override { return device_; }

 private:
  std::shared_ptr<Regions> regions_;
  std::byte* device_base_;
  std::byte* host_base_;
  uint64_t mapped_;
  uint64_t offset_;
  uint64_t size_;
  int device_;
};

FakeDeviceRuntime::FakeDeviceRuntime(int devices, bool peer_access)
    : devices_(devices), peer_access_(peer_access) {}

const FakeDeviceRuntime::Region* FakeDeviceRuntime::Regions::AtOrBelowLocked(
    const std::byte* p, uint64_t* offset) const {
  auto it = by_address.upper_bound(p);
  if (it == by_address.begin()) return nullptr;
  --it;
  *offset = static_cast<uint64_t>(p - it->first);
  return &it->second;
}

int FakeDeviceRuntime::DeviceOf(const void* ptr) const {
  absl::MutexLock lock(&regions_->mu);
  uint64_t off = 0;
  const Region* r = regions_->AtOrBelowLocked(static_cast<const std::byte*>(ptr), &off);
  return r != nullptr && off < r->bytes ? r->device : -1;
}

FakeDeviceRuntime::~FakeDeviceRuntime() = default;

std::string FakeDeviceRuntime::Describe() const {
  return absl::StrCat("fake device runtime (no GPU: memfd-backed), ", devices_, " device(s)");
}

absl::StatusOr<UniqueFd> FakeDeviceRuntime::Allocate(int device, uint64_t bytes) {
  const std::string name = absl::StrCat(kFakeDeviceMemfdPrefix, device);
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC));
  if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("memfd: ", std::strerror(errno)));
  }
  return fd;
}

absl::StatusOr<std::shared_ptr<DeviceMapping>> FakeDeviceRuntime::Import(int device, UniqueFd fd,
                                                                         uint64_t size) {
  return Map(device, fd.get(), 0, size);
}

absl::StatusOr<std::string> FakeDeviceRuntime::ExportIpc(int fd) {
  if (fd < 0) return absl::InvalidArgumentError("no descriptor to export");
  FakeIpcHandle h{};
  std::memcpy(h.magic, kFakeIpcMagic, sizeof(h.magic));
  h.pid = ::getpid();
  h.fd = fd;
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

absl::StatusOr<std::shared_ptr<DeviceMapping>> FakeDeviceRuntime::ImportIpc(
    int device, std::string_view handle, uint64_t offset, uint64_t size, int64_t client_pid) {
  if (handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CUDA IPC handle has ", kCudaIpcHandleBytes, " bytes, not ", handle.size()));
  }
  FakeIpcHandle h{};
  std::memcpy(&h, handle.data(), sizeof(h));
  if (std::memcmp(h.magic, kFakeIpcMagic, sizeof(h.magic)) != 0 || h.pid <= 0 || h.fd < 0) {
    return absl::InvalidArgumentError(
        "the CUDA IPC handle is not one this (fake) runtime made (FakeDeviceRuntime::ExportIpc)");
  }
  if (h.pid != client_pid) {
    return absl::PermissionDeniedError(absl::StrCat("the CUDA IPC handle was made by process ",
                                                    h.pid, ", not by this session's process ",
                                                    client_pid));
  }
  // What opening a legacy IPC handle needs: the maker's process, visible here (hostIPC/hostPID).
  const std::string path = absl::StrCat("/proc/", h.pid, "/fd/", h.fd);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot open the CUDA IPC handle's allocation (",
                                                   path, "): ", std::strerror(errno)));
  }
  return Map(device, fd.get(), offset, size);
}

absl::StatusOr<std::shared_ptr<DeviceMapping>> FakeDeviceRuntime::Map(int device, int fd,
                                                                      uint64_t offset,
                                                                      uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("device memory size must be > 0");
  if (device < 0 || device >= devices_) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device, " is not one of the ",
                                                   devices_, " devices this daemon sees"));
  }
  // What the descriptor is: "/memfd:railyard-fake-device-<N> (deleted)" for a fake allocation.
  char link[256] = {};
  struct stat st {};
  const std::string proc = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = fd >= 0 ? ::readlink(proc.c_str(), link, sizeof(link) - 1) : -1;
  const absl::string_view what(link, n > 0 ? static_cast<size_t>(n) : 0);
  const std::string prefix = absl::StrCat("/memfd:", kFakeDeviceMemfdPrefix);
  int home = -1;
  if (!absl::StartsWith(what, prefix) || ::fstat(fd, &st) != 0 ||
      !absl::SimpleAtoi(what.substr(prefix.size(), what.find(' ') - prefix.size()), &home)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the descriptor is not an exported device allocation (the fake runtime takes memfds named ",
        kFakeDeviceMemfdPrefix, "<device>; this is '", what, "')"));
  }
  const auto allocated = static_cast<uint64_t>(st.st_size);
  if (home != device) {
    return absl::InvalidArgumentError(absl::StrCat("the allocation lives on device ", home,
                                                   ", not on device ", device, " as registered"));
  }
  if (offset > allocated || size > allocated - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device memory of ", size, " bytes", offset > 0 ? absl::StrCat(" at offset ", offset) : "",
        " does not fit the exported allocation of ", allocated, " bytes"));
  }
  const uint64_t mapped = offset + size;
  void* host = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (host == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("mmap: ", std::strerror(errno)));
  }
  void* dev =
      ::mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (dev == MAP_FAILED) {
    ::munmap(host, mapped);
    return absl::ResourceExhaustedError(absl::StrCat("mmap: ", std::strerror(errno)));
  }
  auto* d = static_cast<std::byte*>(dev);
  auto* h = static_cast<std::byte*>(host);
  {
    absl::MutexLock lock(&regions_->mu);
    regions_->by_address[d + offset] = Region{h + offset, size, device};
  }
  return std::make_shared<Mapping>(regions_, d, h, mapped, offset, size, device);
}

size_t FakeDeviceRuntime::live_mappings() const {
  absl::MutexLock lock(&regions_->mu);
  return regions_->by_address.size();
}

absl::StatusOr<std::byte*> FakeDeviceRuntime::Translate(int device, const void* ptr,
                                                        uint64_t bytes) const {
  absl::MutexLock lock(&regions_->mu);
  uint64_t off = 0;
  const Region* r = regions_->AtOrBelowLocked(static_cast<const std::byte*>(ptr), &off);
  if (r != nullptr && off <= r->bytes && bytes <= r->bytes - off) {
    if (!CanAccessPeer(device, r->device)) {
      return absl::InvalidArgumentError(absl::StrCat("pointer is memory of device ", r->device,
                                                     ", which device ", device, " cannot access"));
    }
    return r->host + off;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pointer ", absl::Hex(reinterpret_cast<uintptr_t>(ptr)), " (", bytes,
                   " bytes) is not device memory imported on device ", device));
}

absl::Status FakeDeviceRuntime::ReduceToMany(int device, kernels::DataType dtype, kernels::RedOp op,
                                             void* const* dsts, int ndsts, const void* const* srcs,
                                             int nsrcs, size_t count, uint32_t avg_divisor) {
  if (ndsts < 1 || nsrcs < 1 || ndsts > kMaxPointers || nsrcs > kMaxPointers) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce of ", nsrcs, " sources into ", ndsts, " destinations"));
  }
  const uint64_t bytes = count * kernels::ElementSize(dtype);
  void* d[kMaxPointers];
  const void* s[kMaxPointers];
  for (int k = 0; k < ndsts; ++k) {
    absl::StatusOr<std::byte*> h = Translate(device, dsts[k], bytes);
    if (!h.ok()) return h.status();
    d[k] = *h;
  }
  for (int k = 0; k < nsrcs; ++k) {
    absl::StatusOr<std::byte*> h = Translate(device, srcs[k], bytes);
    if (!h.ok()) return h.status();
    s[k] = *h;
  }
  kernels::ReduceToMany(dtype, op, d, ndsts, s, nsrcs, count, avg_divisor);
  steps_.fetch_add(1);
  return absl::OkStatus();
}

absl::Status FakeDeviceRuntime::Copy(int device, void* dst, const void* src, size_t bytes) {
  absl::StatusOr<std::byte*> d = Translate(device, dst, bytes);
  if (!d.ok()) return d.status();
  absl::StatusOr<std::byte*> s = Translate(device, src, bytes);
  if (!s.ok()) return s.status();
  kernels::Copy(*d, *s, bytes);
  steps_.fetch_add(1);
  return absl::OkStatus();
}

absl::Status FakeDeviceRuntime::Swap(int device, void* a, void* b, size_t bytes) {
  absl::StatusOr<std::byte*> x = Translate(device, a, bytes);
  if (!x.ok()) return x.status();
  absl::StatusOr<std::byte*> y = Translate(device, b, bytes);
  if (!y.ok()) return y.status();
  kernels::Swap(*x, *y, bytes);
  steps_.fetch_add(1);
  return absl::OkStatus();
}

absl::Status FakeDeviceRuntime::CopyToHost(int device, void* host_dst, const void* device_src,
                                           size_t bytes) {
  absl::StatusOr<std::byte*> s = Translate(device, device_src, bytes);
  if (!s.ok()) return s.status();
  std::memcpy(host_dst, *s, bytes);
  steps_.fetch_add(1);
  return absl::OkStatus();
}

absl::Status FakeDeviceRuntime::CopyFromHost(int device, void* device_dst, const void* host_src,
                                             size_t bytes) {
  absl::StatusOr<std::byte*> d = Translate(device, device_dst, bytes);
  if (!d.ok()) return d.status();
  std::memcpy(*d, host_src, bytes);
  steps_.fetch_add(1);
  return absl::OkStatus();
}

namespace {

class PopulatedHostMemory : public PinnedHostMemory {
 public:
  PopulatedHostMemory(std::byte* data, size_t size) : data_(data), size_(size) {}
  ~PopulatedHostMemory() override { ::munmap(data_, size_); }
  std::byte* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  std::byte* const data_;
  const size_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PinnedHostMemory>> FakeDeviceRuntime::AllocatePinned(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot pin 0 bytes of host memory");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", bytes, " bytes of pinned host memory: ", std::strerror(errno)));
  }
  pinned_allocations_.fetch_add(1);
  return std::make_unique<PopulatedHostMemory>(static_cast<std::byte*>(p), bytes);
}

absl::Status FakeDeviceRuntime::Synchronize(int device) {
  if (device < 0 || device >= devices_) {
    return absl::InvalidArgumentError(absl::StrCat("no device ", device));
  }
  return absl::OkStatus();
}

}  // namespace railyard::device
