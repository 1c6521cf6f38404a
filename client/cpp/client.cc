// Public API of the C++ client (include/railyard/client.h) over ClientCore.
#include "railyard/client.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client_core.h"
#include "derived_comm_id.h"
#include "memfd_buffer.h"
#include "railyard/device_memory.h"
#include "small_pool.h"

namespace railyard {

// A Work's state is its pending request: the session completes it.
struct Work::State : internal::PendingRequest {};

namespace {

// This thread's open group (GroupStart/GroupEnd): its depth and what it holds, in order.
struct Deferred {
  std::shared_ptr<ClientCore> core;
  v1::SubmitRequest request;
  std::shared_ptr<internal::PendingRequest> pending;
};
thread_local int group_depth = 0;
thread_local std::vector<Deferred> group_ops;

}  // namespace

void GroupStart() { ++group_depth; }

absl::Status GroupEnd() {
  if (group_depth == 0) return absl::FailedPreconditionError("GroupEnd() without GroupStart()");
  if (--group_depth > 0) return absl::OkStatus();
  std::vector<Deferred> ops;
  ops.swap(group_ops);
  // One group per session, each in the order its operations were made.
  std::vector<bool> sent(ops.size(), false);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (sent[i]) continue;
    std::vector<std::pair<v1::SubmitRequest, std::shared_ptr<internal::PendingRequest>>> group;
    for (size_t j = i; j < ops.size(); ++j) {
      if (sent[j] || ops[j].core != ops[i].core) continue;
      sent[j] = true;
      group.emplace_back(std::move(ops[j].request), std::move(ops[j].pending));
    }
    ops[i].core->SubmitGroup(std::move(group));
  }
  return absl::OkStatus();
}

namespace {

v1::DataType ToProto(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return v1::DATA_TYPE_FLOAT32;
    case DataType::kFloat64:
      return v1::DATA_TYPE_FLOAT64;
    case DataType::kFloat16:
      return v1::DATA_TYPE_FLOAT16;
    case DataType::kBFloat16:
      return v1::DATA_TYPE_BFLOAT16;
    case DataType::kInt8:
      return v1::DATA_TYPE_INT8;
    case DataType::kUint8:
      return v1::DATA_TYPE_UINT8;
    case DataType::kInt32:
      return v1::DATA_TYPE_INT32;
    case DataType::kUint32:
      return v1::DATA_TYPE_UINT32;
    case DataType::kInt64:
      return v1::DATA_TYPE_INT64;
    case DataType::kUint64:
      return v1::DATA_TYPE_UINT64;
  }
  return v1::DATA_TYPE_UNSPECIFIED;
}

v1::RedOp ToProto(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return v1::RED_OP_SUM;
    case RedOp::kProd:
      return v1::RED_OP_PROD;
    case RedOp::kMin:
      return v1::RED_OP_MIN;
    case RedOp::kMax:
      return v1::RED_OP_MAX;
    case RedOp::kAvg:
      return v1::RED_OP_AVG;
  }
  return v1::RED_OP_UNSPECIFIED;
}

uint64_t ElementBytes(v1::DataType dtype) {
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT64:
    case v1::DATA_TYPE_INT64:
    case v1::DATA_TYPE_UINT64:
      return 8;
    case v1::DATA_TYPE_FLOAT32:
    case v1::DATA_TYPE_INT32:
    case v1::DATA_TYPE_UINT32:
      return 4;
    case v1::DATA_TYPE_FLOAT16:
    case v1::DATA_TYPE_BFLOAT16:
      return 2;
    default:
      return 1;
  }
}

// Bytes an operation reads from its send region and writes to its receive region (NCCL's
// shapes); nullopt where it cannot be worked out (a bad request, an overflow): then assume the
// worst.
std::optional<std::pair<uint64_t, uint64_t>> Extents(const v1::SubmitRequest& r, int nranks) {
  const uint64_t e = ElementBytes(r.dtype());
  const uint64_t n = static_cast<uint64_t>(nranks);
  if (r.count() > (uint64_t{1} << 48) || n == 0) return std::nullopt;
  const uint64_t one = r.count() * e;
  switch (r.op()) {
    case v1::COLLECTIVE_OP_ALL_REDUCE:
    case v1::COLLECTIVE_OP_BROADCAST:
    case v1::COLLECTIVE_OP_REDUCE:
      return std::make_pair(one, one);
    case v1::COLLECTIVE_OP_REDUCE_SCATTER:
      return std::make_pair(one * n, one);
    case v1::COLLECTIVE_OP_ALL_GATHER:
      return std::make_pair(one, one * n);
    case v1::COLLECTIVE_OP_ALL_TO_ALL:
      return std::make_pair(one * n, one * n);
    case v1::COLLECTIVE_OP_ALL_TO_ALL_V: {
      auto end = [&](const auto& counts, const auto& displs) -> std::optional<uint64_t> {
        if (counts.size() != displs.size()) return std::nullopt;
        uint64_t hi = 0;
        for (int i = 0; i < counts.size(); ++i) {
          if (counts[i] > (uint64_t{1} << 48) || displs[i] > (uint64_t{1} << 48)) {
            return std::nullopt;
          }
          hi = std::max(hi, (counts[i] + displs[i]) * e);
        }
        return hi;
      };
      std::optional<uint64_t> s = end(r.send_counts(), r.send_displs());
      std::optional<uint64_t> d = end(r.recv_counts(), r.recv_displs());
      if (!s.has_value() || !d.has_value()) return std::nullopt;
      return std::make_pair(*s, *d);
    }
    case v1::COLLECTIVE_OP_BARRIER:
      return std::make_pair(uint64_t{0}, uint64_t{0});
    default:
      return std::nullopt;
  }
}

// True when the operation's output may overlap its input: running it again would not start from
// the same data (the regions as NCCL's shapes size them, at the addresses this process sees).
bool InputMayBeOverwritten(const v1::SubmitRequest& r, int nranks, BufferRef send, BufferRef recv) {
  if (send.buffer == nullptr || recv.buffer == nullptr) return false;  // one side only
  const std::optional<std::pair<uint64_t, uint64_t>> bytes = Extents(r, nranks);
  const auto* s0 = static_cast<const std::byte*>(send.buffer->data());
  const auto* r0 = static_cast<const std::byte*>(recv.buffer->data());
  if (!bytes.has_value() || s0 == nullptr || r0 == nullptr) return true;
  const std::byte* s = s0 + send.offset;
  const std::byte* d = r0 + recv.offset;
  if (bytes->first == 0 || bytes->second == 0) return false;
  return s < d + bytes->second && d < s + bytes->first;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Buffer

Buffer::Buffer(Buffer&& other) noexcept
    : core_(std::move(other.core_)),
      data_(other.data_),
      size_(other.size_),
      id_(other.id_),
      device_(other.device_),
      device_memory_(std::move(other.device_memory_)),
      chunk_(std::move(other.chunk_)) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.id_ = 0;
  other.device_ = -1;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Buffer old(std::move(*this));  // released at the end of this scope
    core_ = std::move(other.core_);
    data_ = other.data_;
    size_ = other.size_;
    id_ = other.id_;
    device_ = other.device_;
    device_memory_ = std::move(other.device_memory_);
    chunk_ = std::move(other.chunk_);
    other.data_ = nullptr;
    other.size_ = 0;
    other.id_ = 0;
    other.device_ = -1;
  }
  return *this;
}

Buffer::~Buffer() {
  // The daemon unmaps the session's buffers itself when the session is gone.
  if (core_ != nullptr && id_ != 0 && core_->alive()) (void)core_->ReleaseBuffer(id_);
  if (chunk_ != nullptr) return;  // a pooled part: chunk_'s lease gives it back, mapped
  if (device_ < 0) internal::UnmapBuffer(data_, size_);  // device memory: device_memory_ frees it
}

// ---------------------------------------------------------------------------------------------
// Work

absl::Status Work::wait(std::chrono::milliseconds timeout) {
  if (state_ == nullptr) {
    return absl::FailedPreconditionError("wait() on an empty Work (default-constructed)");
  }
  return state_->Wait(timeout);
}

bool Work::test() const { return state_ != nullptr && state_->Test(); }

uint64_t Work::seq() const { return state_ == nullptr ? 0 : state_->seq(); }

// ---------------------------------------------------------------------------------------------
// Comm

Comm& Comm::operator=(Comm&& other) noexcept {
  if (this != &other) {
    Comm old(std::move(*this));  // leaves the old communicator at the end of this scope
    core_ = std::move(other.core_);
    handle_ = other.handle_;
    rank_ = other.rank_;
    nranks_ = other.nranks_;
    nnodes_ = other.nnodes_;
    other.handle_ = 0;
  }
  return *this;
}

Comm::~Comm() {
  if (core_ != nullptr && handle_ != 0 && core_->alive()) (void)core_->DestroyComm(handle_);
}

absl::Status Comm::Destroy() {
  if (core_ == nullptr || handle_ == 0) return absl::OkStatus();
  absl::Status status = core_->DestroyComm(handle_);
  core_.reset();
  handle_ = 0;
  return status;
}

Work Comm::Submit(v1::SubmitRequest* request, BufferRef send, BufferRef recv,
                  const CollectiveOptions& opts) {
  Work work;
  work.state_ = std::make_shared<Work::State>();
  if (core_ == nullptr || handle_ == 0) {
    work.state_->Complete(absl::FailedPreconditionError(
                              "communicator not initialized (default-constructed, moved from or "
                              "destroyed)"),
                          0);
    return work;
  }
  auto set_ref = [&](const char* which, BufferRef ref, v1::BufferRef* out) -> absl::Status {
    if (ref.buffer == nullptr) return absl::OkStatus();  // unset (buffer_id 0)
    if (ref.buffer->id_ == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, " buffer is empty (default-constructed or moved from)"));
    }
    if (ref.buffer->core_ != core_) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, " buffer belongs to another Client than this communicator"));
    }
    out->set_buffer_id(ref.buffer->id_);
    out->set_offset(ref.offset);
    return absl::OkStatus();
  };
  absl::Status st = set_ref("send", send, request->mutable_send());
  if (st.ok()) st = set_ref("recv", recv, request->mutable_recv());
  const int64_t timeout_ms = opts.timeout.count();
  if (st.ok() && (timeout_ms < 0 || timeout_ms > std::numeric_limits<uint32_t>::max())) {
    st = absl::InvalidArgumentError(absl::StrCat("timeout ", timeout_ms, " ms out of range"));
  }
  if (st.ok()) st = SetStreamSync(opts, request, work.state_.get());
  if (!st.ok()) {
    work.state_->Complete(std::move(st), 0);
    return work;
  }
  request->set_comm_handle(handle_);
  request->set_timeout_ms(static_cast<uint32_t>(timeout_ms));
  request->set_algo(opts.algo.empty() ? core_->default_algo() : opts.algo);
  request->set_compression(opts.compression.empty() ? core_->default_compression()
                                                    : opts.compression);
  if (opts.compression_key.has_value()) {
    request->set_error_feedback(true);
    request->set_compression_key(*opts.compression_key);
  }
  // After a daemon crash it runs again only if it cannot have overwritten its own input: its
  // output lies in other memory than its input (docs/restarts.md).
  work.state_->rerun_safe = !InputMayBeOverwritten(*request, nranks_, send, recv);
  if (group_depth > 0) {
    group_ops.push_back({core_, std::move(*request), work.state_});
    return work;
  }
  core_->Submit(std::move(*request), work.state_);
  return work;
}

absl::Status Comm::SetStreamSync(const CollectiveOptions& opts, v1::SubmitRequest* request,
                                 internal::PendingRequest* pending) {
  if (opts.stream != nullptr && opts.stream_sync.has_value()) {
    return absl::InvalidArgumentError(
        "CollectiveOptions: set stream or stream_sync, not both (each orders the operation)");
  }
  uint64_t buffer_id = 0, offset = 0;
  uint32_t value = 0;
  if (opts.stream_sync.has_value()) {
    const CollectiveOptions::StreamSync& sync = *opts.stream_sync;
    if (sync.words == nullptr || sync.words->id_ == 0) {
      return absl::InvalidArgumentError("stream_sync.words: no buffer (null, empty or moved from)");
    }
    if (sync.words->core_ != core_) {
      return absl::InvalidArgumentError(
          "stream_sync.words: the buffer belongs to another Client than this communicator");
    }
    buffer_id = sync.words->id_;
    offset = sync.offset;
    value = sync.value;
  } else if (opts.stream != nullptr) {
    absl::StatusOr<internal::StreamWords*> words = core_->StreamWords();
    absl::StatusOr<internal::StreamWords::Slot> slot =
        words.ok() ? (*words)->Enqueue(opts.stream)
                   : absl::StatusOr<internal::StreamWords::Slot>(words.status());
    if (!slot.ok()) {
      return absl::Status(slot.status().code(), absl::StrCat("ordering the operation on its "
                                                             "stream: ",
                                                             slot.status().message()));
    }
    // From here the stream waits for done: every way this request ends must store it.
    pending->SetStreamDone(slot->done, slot->value);
    buffer_id = slot->buffer_id;
    offset = slot->offset;
    value = slot->value;
  } else {
    return absl::OkStatus();
  }
  v1::StreamSync* out = request->mutable_stream_sync();
  out->mutable_words()->set_buffer_id(buffer_id);
  out->mutable_words()->set_offset(offset);
  out->set_value(value);
  return absl::OkStatus();
}

Work Comm::AllReduce(BufferRef send, BufferRef recv, size_t count, DataType dtype, RedOp op,
                     const CollectiveOptions& opts) {
  v1::SubmitRequest request;
  request.set_op(v1::COLLECTIVE_OP_ALL_REDUCE);
  request.set_dtype(ToProto(dtype));
  request.set_red_op(ToProto(op));
  request.set_count(count);
  return Submit(&request, send, recv, opts);
}

Work Comm::ReduceScatter(BufferRef send, BufferRef recv, size_t recvcount, DataType dtype, RedOp op,
                         const CollectiveOptions& opts) {
  v1::SubmitRequest request;
  request.set_op(v1::COLLECTIVE_OP_REDUCE_SCATTER);
  request.set_dtype(ToProto(dtype));
  request.set_red_op(ToProto(op));
  request.set_count(recvcount);
  return Submit(&request, send, recv, opts);
}

Work Comm::AllGather(BufferRef send, BufferRef recv, size_t sendcount, DataType dtype,
                     const CollectiveOptions& opts) {
  v1::SubmitRequest request;
  request.set_op(v1::COLLECTIVE_OP_ALL_GATHER);
  request.set_dtype(ToProto(dtype));
  request.set_count(sendcount);
  return Submit(&request, send, recv, opts);
}

Work Comm::Broadcast(BufferRef send, BufferRef recv, size_t count, DataType dtype, int root,
                     const CollectiveOptions& opts) {
  v1::SubmitRequest request;
  request.set_op(v1::COLLECTIVE_OP_BROADCAST);
  request.set_dtype(ToProto(dtype));
  request.set_count(count);
  request.set_root(root);
  return Submit(&request, send, recv, opts);
}

Work Comm::Reduce(BufferRef send, BufferRef recv, size_t count, DataType dtype, RedOp op, int root,
                  const CollectiveOptions& opts) {
  v1::SubmitRequest request;
  request.set_op(v1::COLLECTIVE_OP_REDUCE);
  request.set_dtype(ToProto(dtype));
  request.set_red_op(ToProto(op));
  request.set_count(count);
  request.set_root(root);
  return Submit(&request, send, recv, opts);
}

Work Comm::AllToAll(BufferRef send, BufferRef recv, size_t count, DataType dtype,
                    const CollectiveOptions& opts) {
  v1::SubmitRequest request;
  request.set_op(v1::COLLECTIVE_OP_ALL_TO_ALL);
  request.set_dtype(ToProto(dtype));
  request.set_count(count);
  return Submit(&request, send, recv, opts);
}

Work Comm::AllToAllv(BufferRef send, const std::vector<uint64_t>& send_counts,
                     const std::vector<uint64_t>& send_displs, BufferRef recv,
                     const std::vector<uint64_t>& recv_counts,
                     const std::vector<uint64_t>& recv_displs, DataType dtype,
                     const CollectiveOptions& opts) {
  v1::SubmitRequest request;
  request.set_op(v1::COLLECTIVE_OP_ALL_TO_ALL_V);
  request.set_dtype(ToProto(dtype));
  request.mutable_send_counts()->Add(send_counts.begin(), send_counts.end());
  request.mutable_send_displs()->Add(send_displs.begin(), send_displs.end());
  request.mutable_recv_counts()->Add(recv_counts.begin(), recv_counts.end());
  request.mutable_recv_displs()->Add(recv_displs.begin(), recv_displs.end());
  return Submit(&request, send, recv, opts);
}

Work Comm::Send(BufferRef send, size_t count, DataType dtype, int peer,
                const CollectiveOptions& opts) {
  v1::SubmitRequest request;
  request.set_op(v1::COLLECTIVE_OP_SEND);
  request.set_dtype(ToProto(dtype));
  request.set_count(count);
  request.set_root(peer);
  return Submit(&request, send, BufferRef(), opts);
}

Work Comm::Recv(BufferRef recv, size_t count, DataType dtype, int peer,
                const CollectiveOptions& opts) {
  v1::SubmitRequest request;
  request.set_op(v1::COLLECTIVE_OP_RECV);
  request.set_dtype(ToProto(dtype));
  request.set_count(count);
  request.set_root(peer);
  return Submit(&request, BufferRef(), recv, opts);
}

Work Comm::Barrier(const CollectiveOptions& opts) {
  v1::SubmitRequest request;
  request.set_op(v1::COLLECTIVE_OP_BARRIER);
  return Submit(&request, BufferRef(), BufferRef(), opts);
}

// ---------------------------------------------------------------------------------------------
// Client

Client::Client(std::shared_ptr<ClientCore> core, bool pool_small_buffers)
    : core_(std::move(core)),
      pool_(!pool_small_buffers
                ? nullptr
                : std::make_unique<internal::SmallPool>(
                      [this](size_t size) -> absl::StatusOr<internal::SmallPool::Slab> {
                        absl::StatusOr<Buffer> b = AllocateRegistered(size);
                        if (!b.ok()) return b.status();
                        internal::SmallPool::Slab slab;
                        slab.buffer_id = b->id();
                        slab.data = static_cast<std::byte*>(b->data());
                        slab.owner = std::make_shared<Buffer>(*std::move(b));
                        return slab;
                      })) {}

Client::~Client() {
  core_->Shutdown();
  pool_.reset();  // slabs no chunk holds are released now (into a session that is gone)
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  absl::StatusOr<std::shared_ptr<ClientCore>> core = ClientCore::Connect(options);
  if (!core.ok()) return core.status();
  return std::unique_ptr<Client>(new Client(*std::move(core), options.pool_small_buffers));
}

absl::StatusOr<Buffer> Client::Allocate(size_t size) {
  if (size == 0) return absl::InvalidArgumentError("cannot allocate a buffer of 0 bytes");
  if (pool_ == nullptr || !internal::SmallPool::Pooled(size)) return AllocateRegistered(size);
  // The pool may have a chunk at hand; a forked child or an ended session is refused alike.
  if (absl::Status s = core_->Usable(); !s.ok()) return s;
  absl::StatusOr<internal::SmallPool::Chunk> chunk = pool_->Take(size);
  if (!chunk.ok()) return chunk.status();
  // The chunk under an id of its own: the daemon checks its bounds exactly, without a mapping.
  absl::StatusOr<uint64_t> id = core_->RegisterPart(chunk->buffer_id, chunk->offset, size);
  if (!id.ok()) return id.status();  // the chunk's lease gives it back
  Buffer buffer;
  buffer.core_ = core_;
  buffer.data_ = chunk->data;
  buffer.size_ = size;
  buffer.id_ = *id;
  buffer.chunk_ = std::move(chunk->lease);
  return buffer;
}

absl::StatusOr<Buffer> Client::AllocateRegistered(size_t size) {
  absl::StatusOr<internal::MemfdBuffer> segment = internal::CreateMemfdBuffer(core_->job(), size);
  if (!segment.ok()) return segment.status();
  absl::StatusOr<uint64_t> id = core_->RegisterBuffer(segment->fd, size);
  // Whatever happened, the descriptor goes now: the two mappings keep the memory alive, and it
  // has no name anyone could open.
  internal::CloseMemfd(&*segment);
  if (!id.ok()) {
    internal::UnmapBuffer(segment->data, segment->size);
    return id.status();
  }
  Buffer buffer;
  buffer.core_ = core_;
  buffer.data_ = segment->data;
  buffer.size_ = segment->size;
  buffer.id_ = *id;
  return buffer;
}

absl::StatusOr<Buffer> Client::RegisterDeviceMemory(int exported_fd, size_t size, int device,
                                                    void* device_ptr) {
  if (size == 0) return absl::InvalidArgumentError("cannot register 0 bytes of device memory");
  if (device < 0)
    return absl::InvalidArgumentError(absl::StrCat("device ", device, " is not a device ordinal"));
  absl::StatusOr<uint64_t> id = core_->RegisterBuffer(exported_fd, size, device);
  if (!id.ok()) return id.status();
  return DeviceBuffer(*id, device_ptr, size, device);
}

Buffer Client::DeviceBuffer(uint64_t id, void* device_ptr, size_t size, int device) const {
  Buffer buffer;
  buffer.core_ = core_;
  buffer.data_ = device_ptr;
  buffer.size_ = size;
  buffer.id_ = id;
  buffer.device_ = device;
  return buffer;
}

absl::StatusOr<Buffer> Client::RegisterCudaIpcMemory(std::string_view cuda_ipc_handle,
                                                     uint64_t offset, size_t size, int device,
                                                     void* device_ptr) {
  if (size == 0) return absl::InvalidArgumentError("cannot register 0 bytes of device memory");
  if (device < 0)
    return absl::InvalidArgumentError(absl::StrCat("device ", device, " is not a device ordinal"));
  absl::StatusOr<uint64_t> id = core_->RegisterCudaIpc(cuda_ipc_handle, offset, size, device);
  if (!id.ok()) return id.status();
  return DeviceBuffer(*id, device_ptr, size, device);
}

absl::StatusOr<Buffer> Client::RegisterDevicePointer(void* device_ptr, size_t size, int device) {
  absl::StatusOr<DevicePointerExport> exported = ExportDevicePointer(device_ptr, size, device);
  if (!exported.ok()) return exported.status();
  if (exported->fd >= 0) {
    absl::StatusOr<Buffer> buffer = RegisterDeviceMemory(exported->fd, size, device, device_ptr);
    ::close(exported->fd);
    return buffer;
  }
  return RegisterCudaIpcMemory(exported->ipc_handle, exported->offset, size, device, device_ptr);
}

absl::StatusOr<Buffer> Client::AllocateDevice(size_t size, int device) {
  absl::StatusOr<DeviceMemory> memory = DeviceMemory::Allocate(size, device);
  if (!memory.ok()) return memory.status();
  absl::StatusOr<int> fd = memory->ExportFd();
  if (!fd.ok()) return fd.status();
  auto owned = std::make_shared<DeviceMemory>(*std::move(memory));
  absl::StatusOr<Buffer> buffer = RegisterDeviceMemory(*fd, size, device, owned->data());
  ::close(*fd);  // sent (or refused): the daemon holds its own reference to the allocation
  if (!buffer.ok()) return buffer.status();
  buffer->device_memory_ = std::move(owned);
  return buffer;
}

absl::StatusOr<std::string> Client::CreateCommId() { return core_->CreateCommId(); }

absl::StatusOr<Comm> Client::InitComm(const std::string& comm_id, int rank, int nranks,
                                      std::chrono::milliseconds timeout) {
  return Comm::Join(core_, comm_id, rank, nranks, timeout);
}

absl::StatusOr<Comm> Comm::Join(const std::shared_ptr<ClientCore>& core, const std::string& comm_id,
                                int rank, int nranks, std::chrono::milliseconds timeout) {
  if (nranks <= 0 || rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", nranks, " ranks: need 0 <= rank < nranks"));
  }
  absl::StatusOr<v1::InitCommResponse> response = core->InitComm(comm_id, rank, nranks, timeout);
  if (!response.ok()) return response.status();
  Comm comm;
  comm.core_ = core;
  comm.handle_ = response->comm_handle();
  comm.rank_ = rank;
  comm.nranks_ = nranks;
  comm.nnodes_ = response->nnodes();
  return comm;
}

absl::StatusOr<Comm> Comm::Shrink(const std::vector<int>& exclude,
                                  std::chrono::milliseconds timeout) {
  if (core_ == nullptr || handle_ == 0) {
    return absl::FailedPreconditionError("Shrink on a communicator not initialized or destroyed");
  }
  std::set<int> gone;
  for (int r : exclude) {
    if (r < 0 || r >= nranks_) {
      return absl::InvalidArgumentError(
          absl::StrCat("Shrink: excluded rank ", r, " not in [0, ", nranks_, ")"));
    }
    gone.insert(r);
  }
  if (gone.count(rank_) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Shrink: rank ", rank_, " is in its own exclude list"));
  }
  if (static_cast<int>(gone.size()) == nranks_) {
    return absl::InvalidArgumentError("Shrink: every rank excluded");
  }
  absl::StatusOr<std::string> id = core_->CommIdOf(handle_);
  if (!id.ok()) return id.status();
  // The coordinator's node may be among the excluded (dead): the daemon names the survivors'.
  absl::StatusOr<std::string> coordinator =
      ShrinkCoordinator(std::vector<int>(gone.begin(), gone.end()));
  if (!coordinator.ok()) return coordinator.status();
  return JoinShrunk(*id, ++children_, gone, *coordinator, timeout);
}

absl::StatusOr<Comm> Comm::JoinShrunk(const std::string& id, uint64_t child,
                                      const std::set<int>& gone, const std::string& coordinator,
                                      std::chrono::milliseconds timeout) const {
  const std::string child_id = internal::DerivedCommId(
      id, absl::StrCat("shrink/", child, "/", absl::StrJoin(gone, ",")), coordinator);
  int newrank = rank_;
  for (int g : gone) newrank -= g < rank_ ? 1 : 0;
  return Join(core_, child_id, newrank, nranks_ - static_cast<int>(gone.size()), timeout);
}

absl::StatusOr<std::string> Comm::ShrinkCoordinator(const std::vector<int>& exclude) const {
  if (core_ == nullptr || handle_ == 0) {
    return absl::FailedPreconditionError(
        "ShrinkCoordinator on a communicator not initialized or destroyed");
  }
  absl::StatusOr<v1::CommCensusResponse> c = core_->CommCensus(handle_, 0, exclude);
  if (c.ok()) return c->coordinator();
  if (c.status().code() == absl::StatusCode::kUnimplemented) return std::string();
  return c.status();
}

absl::StatusOr<Comm::Lost> Comm::LostRanks(std::chrono::milliseconds timeout) const {
  if (core_ == nullptr || handle_ == 0) {
    return absl::FailedPreconditionError(
        "LostRanks on a communicator not initialized or destroyed");
  }
  if (timeout.count() <= 0 || timeout > std::chrono::milliseconds(30000)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LostRanks: timeout ", timeout.count(), " ms not in (0, 30000]"));
  }
  absl::StatusOr<v1::CommCensusResponse> c =
      core_->CommCensus(handle_, static_cast<uint32_t>(timeout.count()));
  if (!c.ok()) return c.status();
  Lost out;
  out.ranks.assign(c->lost_ranks().begin(), c->lost_ranks().end());
  out.nodes.assign(c->lost_nodes().begin(), c->lost_nodes().end());
  out.coordinator = c->coordinator();
  const int code = c->failure_code();
  out.failure = code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                    ? absl::Status(static_cast<absl::StatusCode>(code), c->failure())
                    : absl::OkStatus();
  return out;
}

absl::StatusOr<Comm> Comm::ShrinkLost(std::chrono::milliseconds timeout) {
  absl::StatusOr<Lost> lost = LostRanks();
  if (!lost.ok()) return lost.status();
  if (lost->ranks.empty()) {
    return absl::FailedPreconditionError(
        lost->failure.ok() ? "ShrinkLost: no rank is gone and the communicator has not failed"
                           : absl::StrCat("ShrinkLost: no rank is gone; the communicator failed: ",
                                          lost->failure.message()));
  }
  const std::set<int> gone(lost->ranks.begin(), lost->ranks.end());
  if (gone.count(rank_) != 0 || static_cast<int>(gone.size()) >= nranks_) {
    return absl::FailedPreconditionError(
        absl::StrCat("ShrinkLost: the daemons count this rank (", rank_, ") among the lost"));
  }
  absl::StatusOr<std::string> id = core_->CommIdOf(handle_);
  if (!id.ok()) return id.status();
  absl::StatusOr<Comm> joined = JoinShrunk(*id, children_ + 1, gone, lost->coordinator, timeout);
  if (joined.ok()) ++children_;
  return joined;
}

absl::StatusOr<std::string> Comm::GrowId(int new_nranks) const {
  if (core_ == nullptr || handle_ == 0) {
    return absl::FailedPreconditionError("GrowId on a communicator not initialized or destroyed");
  }
  if (new_nranks <= nranks_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Grow to ", new_nranks, " ranks: not more than ", nranks_));
  }
  absl::StatusOr<std::string> id = core_->CommIdOf(handle_);
  if (!id.ok()) return id.status();
  return internal::DerivedCommId(*id, absl::StrCat("grow/", children_ + 1, "/", new_nranks));
}

absl::StatusOr<Comm> Comm::Grow(int new_nranks, std::chrono::milliseconds timeout) {
  absl::StatusOr<std::string> id = GrowId(new_nranks);
  if (!id.ok()) return id.status();
  ++children_;
  return Join(core_, *id, rank_, new_nranks, timeout);
}

const std::string& Client::session_id() const { return core_->session_id(); }

const std::string& Client::node_name() const { return core_->node_name(); }

uint64_t Client::reconnects() const { return core_->reconnects(); }

}  // namespace railyard
