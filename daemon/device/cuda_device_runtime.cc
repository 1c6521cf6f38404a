#include "daemon/device/cuda_device_runtime.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_vmm.h"
#include "daemon/kernels/cuda/reduce_cuda.h"

namespace railyard::device {
namespace {

using internal::CudaVmm;
using Driver = CudaVmm;

std::string DriverError(const Driver&, CUresult r) { return internal::CudaDriverError(r); }

absl::Status LaunchStatus(const char* what, int e) {
  if (e == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", railyard_cuda_error_string(e)));
}

// Legacy CUDA IPC handles opened in this process, by handle bytes: the driver maps an allocation
// once per process (a second cuIpcOpenMemHandle of the same handle fails), and several buffers of
// a client may lie in one allocation. Closed when its last mapping goes.
struct IpcOpened {
  CUdeviceptr base = 0;
  size_t bytes = 0;
  int refs = 0;
};

// The imported mappings by address (DeviceOf); shared with the mappings, which may outlive the
// runtime.
struct Registry {
  mutable std::mutex mu;
  std::map<CUdeviceptr, std::pair<uint64_t, int>> by_address;  // base -> (mapped bytes, device)
  std::map<std::string, IpcOpened> ipc;                        // CudaIpcMapping's
};

// [ptr, ptr + size) on a device: what both kinds of mapping below hand out. They use the
// process-wide entry points (GetCudaVmm, never destroyed): a mapping may outlive the runtime (a
// session's buffers are released after the daemon's device runtime at shutdown).
class CudaRange : public DeviceMapping {
 public:
  CudaRange(CUdeviceptr ptr, uint64_t size, int device)
      : d_(&internal::GetCudaVmm()), ptr_(ptr), size_(size), device_(device) {}
  std::byte* data() const override { return reinterpret_cast<std::byte*>(ptr_); }
  uint64_t size() const override { return size_; }
  int device() const override { return device_; }

 protected:
  const Driver* const d_;
  const CUdeviceptr ptr_;
  const uint64_t size_;
  const int device_;
};

// An imported VMM allocation, mapped here.
class CudaMapping : public CudaRange {
 public:
  CudaMapping(std::shared_ptr<Registry> registry, CUmemGenericAllocationHandle handle,
              CUdeviceptr ptr, uint64_t mapped, uint64_t size, int device)
      : CudaRange(ptr, size, device),
        registry_(std::move(registry)),
        handle_(handle),
        mapped_(mapped) {
    std::lock_guard<std::mutex> lock(registry_->mu);
    registry_->by_address[ptr_] = {mapped_, device_};
  }
  ~CudaMapping() override {
    {
      std::lock_guard<std::mutex> lock(registry_->mu);
      registry_->by_address.erase(ptr_);
    }
    d_->Unmap(ptr_, mapped_);
    d_->AddressFree(ptr_, mapped_);
    d_->Release(handle_);
  }

 private:
  const std::shared_ptr<Registry> registry_;
  CUmemGenericAllocationHandle handle_;
  uint64_t mapped_;
};

// [ptr, ptr + size) of an opened IPC allocation; the allocation is in the registry (DeviceOf)
// while it is open.
class CudaIpcMapping : public CudaRange {
 public:
  CudaIpcMapping(std::shared_ptr<Registry> registry, std::string handle, CUdeviceptr ptr,
                 uint64_t size, int device)
      : CudaRange(ptr, size, device), registry_(std::move(registry)), handle_(std::move(handle)) {}
  ~CudaIpcMapping() override {
    std::lock_guard<std::mutex> lock(registry_->mu);
    auto it = registry_->ipc.find(handle_);
    if (it != registry_->ipc.end() && --it->second.refs == 0) {
      registry_->by_address.erase(it->second.base);
      d_->IpcCloseMemHandle(it->second.base);
      registry_->ipc.erase(it);
    }
  }

 private:
  const std::shared_ptr<Registry> registry_;
  const std::string handle_;
};

// cudaHostAlloc'd memory; cudaFreeHost needs no runtime object, so it may outlive the runtime.
class CudaPinnedHost : public PinnedHostMemory {
 public:
  CudaPinnedHost(std::byte* data, size_t size) : data_(data), size_(size) {}
  ~CudaPinnedHost() override { cudaFreeHost(data_); }
  std::byte* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  std::byte* const data_;
  const size_t size_;
};

class CudaDeviceRuntime : public DeviceRuntime {
 public:
  explicit CudaDeviceRuntime(int count)
      : d_(internal::GetCudaVmm()),
        count_(count),
        streams_(static_cast<size_t>(count), nullptr),
        peer_(static_cast<size_t>(count) * static_cast<size_t>(count), false) {
    for (int from = 0; from < count; ++from) {
      for (int to = 0; to < count; ++to) {
        int can = from == to ? 1 : 0;
        if (from != to && cudaDeviceCanAccessPeer(&can, from, to) != cudaSuccess) can = 0;
        peer_[static_cast<size_t>(from * count + to)] = can != 0;
      }
    }
  }

  int DeviceOf(const void* ptr) const override {
    const auto p = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr));
    std::lock_guard<std::mutex> lock(registry_->mu);
    auto it = registry_->by_address.upper_bound(p);
    if (it == registry_->by_address.begin()) return -1;
    --it;
    return p - it->first < it->second.first ? it->second.second : -1;
  }
  bool CanAccessPeer(int from, int to) const override {
    return from >= 0 && to >= 0 && from < count_ && to < count_ &&
           peer_[static_cast<size_t>(from * count_ + to)];
  }
  ~CudaDeviceRuntime() override {
    for (int i = 0; i < count_; ++i) {
      if (streams_[i] != nullptr && cudaSetDevice(i) == cudaSuccess) {
        cudaStreamDestroy(streams_[i]);
      }
    }
  }

  int DeviceCount() const override { return count_; }
  std::string Describe() const override {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    int pairs = 0;
    for (int a = 0; a < count_; ++a) {
      for (int b = 0; b < count_; ++b) pairs += a != b && CanAccessPeer(a, b) ? 1 : 0;
    }
    return absl::StrCat("CUDA runtime ", runtime, ", driver ", driver, ", ", count_,
                        " device(s), peer access in ", pairs, " of ", count_ * (count_ - 1),
                        " directions");
  }

  absl::StatusOr<std::shared_ptr<DeviceMapping>> Import(int device, UniqueFd fd,
                                                        uint64_t size) override {
    if (size == 0) return absl::InvalidArgumentError("device memory size must be > 0");
    if (absl::Status s = CheckDevice(device); !s.ok()) return s;
    if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorString(e)));
    }
    CUmemGenericAllocationHandle handle{};
    CUresult r = d_.Import(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    fd.Reset();  // the handle holds the allocation now
    if (r != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the descriptor is not an exported device allocation (cuMemImportFromShareableHandle: ",
          DriverError(d_, r), ")"));
    }
    auto release = [&](absl::Status s) {
      d_.Release(handle);
      return s;
    };
    CUmemAllocationProp prop{};
    if ((r = d_.GetAllocationPropertiesFromHandle(&prop, handle)) != CUDA_SUCCESS) {
      return release(absl::InvalidArgumentError(
          absl::StrCat("cuMemGetAllocationPropertiesFromHandle: ", DriverError(d_, r))));
    }
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != device) {
      return release(absl::InvalidArgumentError(absl::StrCat(
          "the allocation lives on ",
          prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? "device " : "location type ",
          prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop.location.id
                                                            : static_cast<int>(prop.location.type),
          ", not on device ", device, " as registered")));
    }
    size_t gran = 0;
    if ((r = d_.GetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) !=
            CUDA_SUCCESS ||
        gran == 0) {
      return release(
          absl::InternalError(absl::StrCat("cuMemGetAllocationGranularity: ", DriverError(d_, r))));
    }
    if (size > UINT64_MAX - gran) {  // rounding up must not wrap to a small mapping
      return release(absl::InvalidArgumentError(
          absl::StrCat("device memory of ", size, " bytes cannot be mapped")));
    }
    const uint64_t mapped = (size + gran - 1) / gran * gran;
    CUdeviceptr ptr = 0;
    if ((r = d_.AddressReserve(&ptr, mapped, gran, 0, 0)) != CUDA_SUCCESS) {
      return release(absl::ResourceExhaustedError(
          absl::StrCat("cuMemAddressReserve of ", mapped, " bytes: ", DriverError(d_, r))));
    }
    if ((r = d_.Map(ptr, mapped, 0, handle, 0)) != CUDA_SUCCESS) {
      d_.AddressFree(ptr, mapped);
      return release(absl::InvalidArgumentError(absl::StrCat(
          "device memory of ", size, " bytes (", mapped,
          " mapped, the allocation granularity) does not fit the exported allocation (cuMemMap: ",
          DriverError(d_, r), ")")));
    }
    // Its own device, and every peer that can reach it (an operation over ranks on several
    // devices runs kernels that read and write each other's memory).
    std::vector<CUmemAccessDesc> access;
    for (int e = 0; e < count_; ++e) {
      if (!CanAccessPeer(e, device)) continue;
      CUmemAccessDesc a{};
      a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      a.location.id = e;
      a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      access.push_back(a);
    }
    if ((r = d_.SetAccess(ptr, mapped, access.data(), access.size())) != CUDA_SUCCESS) {
      d_.Unmap(ptr, mapped);
      d_.AddressFree(ptr, mapped);
      return release(absl::InternalError(absl::StrCat("cuMemSetAccess: ", DriverError(d_, r))));
    }
    return std::make_shared<CudaMapping>(registry_, handle, ptr, mapped, size, device);
  }

  absl::StatusOr<std::shared_ptr<DeviceMapping>> ImportIpc(
      int device, std::string_view handle, uint64_t offset, uint64_t size,
      int64_t /*client_pid: not checkable*/) override {
    if (size == 0) return absl::InvalidArgumentError("device memory size must be > 0");
    if (handle.size() != kCudaIpcHandleBytes) {
      return absl::InvalidArgumentError(absl::StrCat("a CUDA IPC handle has ", kCudaIpcHandleBytes,
                                                     " bytes, not ", handle.size()));
    }
    if (absl::Status s = CheckDevice(device); !s.ok()) return s;
    if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorString(e)));
    }
    const std::string key(handle);
    CUdeviceptr ptr = 0;
    {
      std::lock_guard<std::mutex> lock(registry_->mu);
      absl::StatusOr<IpcOpened*> opened = OpenIpcLocked(key, device);
      if (!opened.ok()) return opened.status();
      if (offset > (*opened)->bytes || size > (*opened)->bytes - offset) {
        if ((*opened)->refs == 0) CloseIpcLocked(key);
        return absl::InvalidArgumentError(
            absl::StrCat("device memory of ", size, " bytes at offset ", offset,
                         " does not fit the CUDA IPC allocation of ", (*opened)->bytes, " bytes"));
      }
      ++(*opened)->refs;
      ptr = (*opened)->base + offset;
    }
    return std::make_shared<CudaIpcMapping>(registry_, key, ptr, size, device);
  }

  absl::Status ReduceToMany(int device, kernels::DataType dtype, kernels::RedOp op,
                            void* const* dsts, int ndsts, const void* const* srcs, int nsrcs,
                            size_t count, uint32_t avg_divisor) override {
    absl::StatusOr<cudaStream_t> s = StreamOn(device);
    if (!s.ok()) return s.status();
    return LaunchStatus("reduce kernel", railyard_cuda_reduce_to_many(
                                             static_cast<int>(dtype), static_cast<int>(op), dsts,
                                             ndsts, srcs, nsrcs, count, avg_divisor, *s));
  }
  absl::Status Copy(int device, void* dst, const void* src, size_t bytes) override {
    absl::StatusOr<cudaStream_t> s = StreamOn(device);
    if (!s.ok()) return s.status();
    return LaunchStatus("device copy", railyard_cuda_copy(dst, src, bytes, *s));
  }
  absl::Status Swap(int device, void* a, void* b, size_t bytes) override {
    absl::StatusOr<cudaStream_t> s = StreamOn(device);
    if (!s.ok()) return s.status();
    return LaunchStatus("swap kernel", railyard_cuda_swap(a, b, bytes, *s));
  }
  absl::Status CopyToHost(int device, void* host_dst, const void* device_src,
                          size_t bytes) override {
    return CopyAndWait(device, host_dst, device_src, bytes, cudaMemcpyDeviceToHost);
  }
  absl::Status CopyFromHost(int device, void* device_dst, const void* host_src,
                            size_t bytes) override {
    return CopyAndWait(device, device_dst, host_src, bytes, cudaMemcpyHostToDevice);
  }
  absl::StatusOr<std::unique_ptr<PinnedHostMemory>> AllocatePinned(size_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("cannot pin 0 bytes of host memory");
    void* p = nullptr;
    if (const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable); e != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaHostAlloc of ", bytes, " bytes: ", cudaGetErrorString(e)));
    }
    return std::make_unique<CudaPinnedHost>(static_cast<std::byte*>(p), bytes);
  }
  absl::Status Synchronize(int device) override {
    absl::StatusOr<cudaStream_t> s = StreamOn(device);
    if (!s.ok()) return s.status();
    return LaunchStatus("cudaStreamSynchronize", cudaStreamSynchronize(*s));
  }

 private:
  // The opened allocation of a legacy IPC handle (opened now when it is not yet: on `device`,
  // where it must live); refs 0 when just opened.
  absl::StatusOr<IpcOpened*> OpenIpcLocked(const std::string& key, int device) {
    IpcOpened& opened = registry_->ipc[key];
    if (opened.refs > 0) return &opened;
    CUipcMemHandle h{};
    std::memcpy(&h, key.data(), sizeof(h));
    CUdeviceptr base = 0;
    CUresult r = d_.IpcOpenMemHandle(&base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CUDA_SUCCESS) {
      registry_->ipc.erase(key);
      return absl::InvalidArgumentError(
          absl::StrCat("cannot open the CUDA IPC handle (cuIpcOpenMemHandle: ", DriverError(d_, r),
                       "; the daemon must see the client's process: hostIPC, docs/gpu.md)"));
    }
    opened.base = base;
    CUdeviceptr range_base = 0;
    int ordinal = -1;
    if ((r = d_.GetAddressRange(&range_base, &opened.bytes, base)) != CUDA_SUCCESS ||
        (r = d_.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, base)) !=
            CUDA_SUCCESS) {
      CloseIpcLocked(key);
      return absl::InternalError(
          absl::StrCat("describing an opened CUDA IPC allocation: ", DriverError(d_, r)));
    }
    if (ordinal != device) {
      CloseIpcLocked(key);
      return absl::InvalidArgumentError(absl::StrCat("the allocation lives on device ", ordinal,
                                                     ", not on device ", device, " as registered"));
    }
    registry_->by_address[base] = {opened.bytes, device};
    return &opened;
  }
  void CloseIpcLocked(const std::string& key) {
    auto it = registry_->ipc.find(key);
    if (it == registry_->ipc.end()) return;
    registry_->by_address.erase(it->second.base);
    d_.IpcCloseMemHandle(it->second.base);
    registry_->ipc.erase(it);
  }

  absl::Status CopyAndWait(int device, void* dst, const void* src, size_t bytes,
                           cudaMemcpyKind kind) {
    absl::StatusOr<cudaStream_t> s = StreamOn(device);
    if (!s.ok()) return s.status();
    if (bytes == 0) return absl::OkStatus();
    if (absl::Status st =
            LaunchStatus("cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, kind, *s));
        !st.ok()) {
      return st;
    }
    return LaunchStatus("cudaStreamSynchronize", cudaStreamSynchronize(*s));
  }
  absl::Status CheckDevice(int device) const {
    if (device < 0 || device >= count_) {
      return absl::InvalidArgumentError(absl::StrCat("device ", device, " is not one of the ",
                                                     count_, " devices this daemon sees"));
    }
    return absl::OkStatus();
  }
  // Makes `device` current on this thread and returns its stream (made on first use).
  absl::StatusOr<cudaStream_t> StreamOn(int device) {
    if (absl::Status s = CheckDevice(device); !s.ok()) return s;
    if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorString(e)));
    }
    std::lock_guard<std::mutex> lock(mu_);
    cudaStream_t& s = streams_[static_cast<size_t>(device)];
    if (s == nullptr) {
      if (const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
          e != cudaSuccess) {
        s = nullptr;
        return absl::InternalError(absl::StrCat("cudaStreamCreate: ", cudaGetErrorString(e)));
      }
    }
    return s;
  }

  const Driver& d_;
  const int count_;
  std::mutex mu_;
  std::vector<cudaStream_t> streams_;
  std::vector<bool> peer_;  // [from * count_ + to]: CanAccessPeer
  const std::shared_ptr<Registry> registry_ = std::make_shared<Registry>();
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceRuntime>> OpenCudaDeviceRuntime() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice) {
    count = 0;
  } else if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA is not usable on this node (cudaGetDeviceCount: ", cudaGetErrorString(e),
                     "); serving host memory only"));
  }
  // Without a device the driver's entry points are not needed (and every import is refused).
  if (count > 0) {
    if (const absl::Status& s = internal::GetCudaVmm().status; !s.ok()) return s;
  }
  return std::unique_ptr<DeviceRuntime>(new CudaDeviceRuntime(count));
}

}  // namespace railyard::device
