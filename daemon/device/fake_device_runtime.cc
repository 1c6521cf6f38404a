#include "daemon/device/fake_device_runtime.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/kernels/reduce.h"

namespace railyard::device {

class FakeDeviceRuntime::Mapping : public DeviceMapping {
 public:
  Mapping(FakeDeviceRuntime* owner, std::byte* device_ptr, std::byte* host, uint64_t mapped,
          uint64_t size, int device)
      : owner_(owner),
        device_ptr_(device_ptr),
        host_(host),
        mapped_(mapped),
        size_(size),
        device_(device) {}
  ~Mapping() override {
    owner_->Forget(device_ptr_);
    ::munmap(host_, mapped_);
    ::munmap(device_ptr_, mapped_);
  }
  std::byte* data() const override { return device_ptr_; }
  uint64_t size() const override { return size_; }
  int device() const override { return device_; }

 private:
  FakeDeviceRuntime* owner_;
  std::byte* device_ptr_;
  std::byte* host_;
  uint64_t mapped_;
  uint64_t size_;
  int device_;
};

FakeDeviceRuntime::FakeDeviceRuntime(int devices) : devices_(devices) {}

FakeDeviceRuntime::~FakeDeviceRuntime() = default;

std::string FakeDeviceRuntime::Describe() const {
  return absl::StrCat("fake device runtime (no GPU: memfd-backed), ", devices_, " device(s)");
}

absl::StatusOr<UniqueFd> FakeDeviceRuntime::Allocate(int device, uint64_t bytes) {
  if (device < 0 || device >= devices_) {
    return absl::InvalidArgumentError(absl::StrCat("no device ", device));
  }
  UniqueFd fd(::memfd_create("railyard-fake-device-memory", MFD_CLOEXEC));
  if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("memfd: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return absl::InternalError(std::strerror(errno));
  absl::MutexLock lock(&mu_);
  allocations_[{st.st_dev, st.st_ino}] = {device, bytes};
  return fd;
}

absl::StatusOr<std::shared_ptr<DeviceMapping>> FakeDeviceRuntime::Import(int device, UniqueFd fd,
                                                                         uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("device memory size must be > 0");
  if (device < 0 || device >= devices_) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device, " is not one of the ",
                                                   devices_, " devices this daemon sees"));
  }
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
    return absl::InvalidArgumentError("the descriptor is not an exported device allocation");
  }
  int home = -1;
  uint64_t allocated = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = allocations_.find({st.st_dev, st.st_ino});
    if (it == allocations_.end()) {
      return absl::InvalidArgumentError(
          "the descriptor is not an exported device allocation (the fake runtime made none such)");
    }
    home = it->second.first;
    allocated = it->second.second;
  }
  if (home != device) {
    return absl::InvalidArgumentError(absl::StrCat("the allocation lives on device ", home,
                                                   ", not on device ", device, " as registered"));
  }
  if (size > allocated) {
    return absl::InvalidArgumentError(
        absl::StrCat("device memory of ", size, " bytes does not fit the exported allocation of ",
                     allocated, " bytes"));
  }
  void* host = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (host == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("mmap: ", std::strerror(errno)));
  }
  void* dev = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (dev == MAP_FAILED) {
    ::munmap(host, size);
    return absl::ResourceExhaustedError(absl::StrCat("mmap: ", std::strerror(errno)));
  }
  auto* d = static_cast<std::byte*>(dev);
  {
    absl::MutexLock lock(&mu_);
    regions_[d] = Region{static_cast<std::byte*>(host), size, device};
  }
  return std::make_shared<Mapping>(this, d, static_cast<std::byte*>(host), size, size, device);
}

void FakeDeviceRuntime::Forget(const std::byte* device_ptr) {
  absl::MutexLock lock(&mu_);
  regions_.erase(device_ptr);
}

size_t FakeDeviceRuntime::live_mappings() const {
  absl::MutexLock lock(&mu_);
  return regions_.size();
}

absl::StatusOr<std::byte*> FakeDeviceRuntime::Translate(int device, const void* ptr,
                                                        uint64_t bytes) const {
  const auto* p = static_cast<const std::byte*>(ptr);
  absl::MutexLock lock(&mu_);
  auto it = regions_.upper_bound(p);
  if (it != regions_.begin()) {
    --it;
    const uint64_t off = static_cast<uint64_t>(p - it->first);
    if (p >= it->first && off <= it->second.bytes && bytes <= it->second.bytes - off) {
      if (it->second.device != device) {
        return absl::InvalidArgumentError(
            absl::StrCat("pointer is memory of device ", it->second.device, ", not ", device));
      }
      return it->second.host + off;
    }
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

absl::Status FakeDeviceRuntime::Synchronize(int device) {
  if (device < 0 || device >= devices_) {
    return absl::InvalidArgumentError(absl::StrCat("no device ", device));
  }
  return absl::OkStatus();
}

}  // namespace railyard::device
