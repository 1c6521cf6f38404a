// Railyard C++ client: connect to the node's railyardd, share buffers with it without copies, and
// run collectives on communicators. Errors are absl::Status values carrying the gRPC code and the
// daemon's message.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "railyard/stream_ops.h"
#include "railyard/types.h"

namespace railyard {

class ClientCore;  // shared state between Client, Buffer, Comm and Work (client.cc)
namespace internal {
class SmallPool;
class PendingRequest;
}  // namespace internal
namespace v1 {
class SubmitRequest;
}  // namespace v1

struct ClientOptions {
  // Unix socket of the daemon. Empty: $RAILYARD_SOCKET, else /run/railyard/railyard.sock.
  std::string socket;
  // Job id. Empty: $RAILYARD_JOB, else "default".
  std::string job;
  // Job token. Empty: $RAILYARD_TOKEN, else "".
  std::string token;
  // End-to-end check of the inter-node transfers of the communicators this client joins:
  // "none" or "crc32c" (a CRC-32C per chunk, verified on receipt; a mismatch fails the operation
  // with DATA_LOSS). The strongest any member or daemon asks for applies. Empty:
  // $RAILYARD_INTEGRITY, else the daemon's --integrity.
  std::string integrity;
  // How long Connect waits for the daemon to answer.
  std::chrono::milliseconds connect_timeout{5000};
  // How operations given a stream (CollectiveOptions::stream) are ordered on it
  // (railyard/stream_ops.h). Null: CUDA's, looked up when first needed.
  std::shared_ptr<StreamOps> stream_ops;
  // Allocate() carves allocations of at most 256 KiB from larger pooled buffers, each registered
  // as a part of one (each mapping costs the daemon one of the kernel's, of which each job has
  // a share). False: every Allocate() maps a memfd of its own.
  bool pool_small_buffers = true;
};

// A shared-memory allocation registered with the daemon. Movable, not copyable; released (and
// unmapped in both processes) when destroyed. A small one (at most 256 KiB) is a chunk of a
// larger buffer the Client pools, registered as a part of it (each mapping costs the daemon one
// of the kernel's, of which each job has a share): released, it goes back to the pool.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&&) noexcept;
  Buffer& operator=(Buffer&&) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  // Host memory (Allocate): where this process reads and writes it. Device memory
  // (AllocateDevice, RegisterDeviceMemory): the device address, for cudaMemcpy and kernels.
  void* data() const { return data_; }
  size_t size() const { return size_; }
  uint64_t id() const { return id_; }
  // The CUDA device of device memory; -1 for host memory.
  int device() const { return device_; }
  // Host memory only.
  template <typename T>
  std::span<T> span() const {
    return std::span<T>(static_cast<T*>(data_), size_ / sizeof(T));
  }

 private:
  friend class Client;
  friend class Comm;
  std::shared_ptr<ClientCore> core_;
  void* data_ = nullptr;
  size_t size_ = 0;
  uint64_t id_ = 0;
  int device_ = -1;
  std::shared_ptr<void> device_memory_;  // what AllocateDevice allocated, freed last
  // A pooled chunk (registered as a part of a pooled buffer): the lease that gives it back.
  std::shared_ptr<void> chunk_;
};

// A region of a Buffer: the buffer and a byte offset into it.
struct BufferRef {
  const Buffer* buffer = nullptr;
  size_t offset = 0;
  BufferRef() = default;
  BufferRef(const Buffer& b, size_t off = 0) : buffer(&b), offset(off) {}  // NOLINT: implicit
};

// An operation in flight. wait() may be called more than once; it returns the same status.
class Work {
 public:
  Work() = default;
  // Waits up to timeout for completion. DEADLINE_EXCEEDED (from the client side) if it did not
  // complete in time; the operation keeps running in the daemon and can be waited on again.
  // Without a timeout the daemon's deadlines bound it, and a daemon that stops answering ends
  // it with UNAVAILABLE within two keepalive periods ($RAILYARD_KEEPALIVE_MS, default 5000).
  absl::Status wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::max());
  // True once the operation has completed (successfully or not).
  bool test() const;
  uint64_t seq() const;

 private:
  friend class Comm;
  struct State;
  std::shared_ptr<State> state_;
};

struct CollectiveOptions {
  // How long the daemon waits for the other ranks' matching submission. 0: daemon default.
  std::chrono::milliseconds timeout{0};
  // Forced algorithm; empty: $RAILYARD_ALGO, else the daemon's choice.
  std::string algo;
  // Compression of the inter-node steps (docs/compression.md): "none", "fp16", "bf16",
  // "int8[:B]", "topk:R" or "auto"; empty: $RAILYARD_COMPRESSION, else none. Applies to float32,
  // float16 and bfloat16 sum/avg AllReduce and ReduceScatter across nodes.
  std::string compression;
  // Error feedback under a lossy codec: the daemon keeps a residual under this key (one per
  // tensor or bucket that recurs across iterations) and adds it to the next operation's data.
  // Unset: no feedback.
  std::optional<uint64_t> compression_key;
  // Orders the operation on this stream (a CUstream / cudaStream_t with CUDA; see
  // railyard/stream_ops.h): it starts after the work enqueued on the stream before the call, and
  // work enqueued after the call waits for its results. The Work still says how it ended; a
  // failed operation lets the stream go on too. The Client must outlive the streams' waits.
  void* stream = nullptr;
  // The same ordering, driven by the caller (instead of `stream`): the daemon starts the
  // operation once the u32 at words + offset holds `value` (or passes it, as a counter that may
  // wrap: (int32_t)(ready - value) >= 0) and stores `value` into the u32 after it when the
  // operation has ended, whatever its outcome. `words` is a host Buffer of this Client.
  struct StreamSync {
    const Buffer* words = nullptr;
    uint64_t offset = 0;  // 4-byte aligned; ready at offset, done at offset + 4
    uint32_t value = 0;
  };
  std::optional<StreamSync> stream_sync;
};

// This rank's membership in a communicator.
class Comm {
 public:
  Comm() = default;
  Comm(Comm&&) noexcept = default;
  Comm& operator=(Comm&&) noexcept;  // leaves the communicator it replaces
  ~Comm();                           // leaves the communicator (DestroyComm) if still a member

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // How many daemons (nodes) the communicator spans.
  int nnodes() const { return nnodes_; }
  uint64_t handle() const { return handle_; }

  // Non-blocking collectives. Validation errors are returned by the Work's wait().
  Work AllReduce(BufferRef send, BufferRef recv, size_t count, DataType dtype, RedOp op,
                 const CollectiveOptions& opts = {});
  Work ReduceScatter(BufferRef send, BufferRef recv, size_t recvcount, DataType dtype, RedOp op,
                     const CollectiveOptions& opts = {});
  Work AllGather(BufferRef send, BufferRef recv, size_t sendcount, DataType dtype,
                 const CollectiveOptions& opts = {});
  Work Broadcast(BufferRef send, BufferRef recv, size_t count, DataType dtype, int root,
                 const CollectiveOptions& opts = {});
  Work Reduce(BufferRef send, BufferRef recv, size_t count, DataType dtype, RedOp op, int root,
              const CollectiveOptions& opts = {});
  Work AllToAll(BufferRef send, BufferRef recv, size_t count, DataType dtype,
                const CollectiveOptions& opts = {});
  Work AllToAllv(BufferRef send, const std::vector<uint64_t>& send_counts,
                 const std::vector<uint64_t>& send_displs, BufferRef recv,
                 const std::vector<uint64_t>& recv_counts, const std::vector<uint64_t>& recv_displs,
                 DataType dtype, const CollectiveOptions& opts = {});
  Work Send(BufferRef send, size_t count, DataType dtype, int peer,
            const CollectiveOptions& opts = {});
  Work Recv(BufferRef recv, size_t count, DataType dtype, int peer,
            const CollectiveOptions& opts = {});
  Work Barrier(const CollectiveOptions& opts = {});

  // Leaves the communicator now.
  absl::Status Destroy();

  // A communicator of this one's ranks but those in `exclude` (as ncclCommShrink): the others
  // renumbered in order (rank r becomes r minus the excluded ranks below it). Every surviving
  // rank calls it, with the same list, in the same order as its other Shrink and Grow calls;
  // the excluded ranks do not take part (they may be dead). Its comm id is derived from this
  // one's alike on every rank, so none is handed around, and nothing of this communicator's
  // traffic can match the new one's. This communicator stays as it is (Destroy it when done).
  // INVALID_ARGUMENT for a rank out of range, this rank excluded, or every rank excluded.
  absl::StatusOr<Comm> Shrink(const std::vector<int>& exclude,
                              std::chrono::milliseconds timeout = std::chrono::milliseconds{0});
  // After a failure (a dead node or process; as Python's on_failure="shrink" does on its own):
  // asks the member daemons which ranks are gone (LostRanks: dead, or left) and, when some are,
  // joins the survivors' communicator, as Shrink(lost) would (with the coordinator moved to the
  // lowest survivor's node when the old one's node is gone). Every survivor calls it after the
  // same failure and derives the same id from the same answer. FAILED_PRECONDITION, saying why,
  // when no rank is gone.
  struct Lost {
    std::vector<int> ranks;          // ascending, numbered as in this communicator
    std::vector<std::string> nodes;  // "name (host:port): why" of each node that did not answer
    std::string coordinator;         // the survivors' communicator's coordinator
    absl::Status failure;            // why this communicator failed (OK: it has not)
  };
  absl::StatusOr<Lost> LostRanks(std::chrono::milliseconds timeout = std::chrono::milliseconds{
                                     2000}) const;
  absl::StatusOr<Comm> ShrinkLost(std::chrono::milliseconds timeout = std::chrono::milliseconds{0});
  // The coordinator ("host:port") the id of a shrink without `exclude` names, as Shrink derives
  // it (for a library that derives the id itself, as libnccl's ncclCommShrink): this one's
  // coordinator, unless every rank of its node is excluded. Empty from a daemon without
  // Local.CommCensus (the parent's coordinator then).
  absl::StatusOr<std::string> ShrinkCoordinator(const std::vector<int>& exclude) const;
  // Growing to `new_nranks` (> nranks(), as ncclCommGrow): GrowId is the comm id the new ranks
  // join with (Client::InitComm(id, rank, new_nranks), ranks nranks()..new_nranks-1), handed to
  // them by whatever means the job has; Grow is every existing rank's part (same rank numbers),
  // in the same order as its other Shrink and Grow calls. Returns once all have joined.
  absl::StatusOr<std::string> GrowId(int new_nranks) const;
  absl::StatusOr<Comm> Grow(int new_nranks,
                            std::chrono::milliseconds timeout = std::chrono::milliseconds{0});

 private:
  friend class Client;
  // Fills in the buffers, handle and options, and submits.
  Work Submit(v1::SubmitRequest* request, BufferRef send, BufferRef recv,
              const CollectiveOptions& opts);
  // opts.stream / opts.stream_sync into request->stream_sync (enqueueing the stream's part).
  absl::Status SetStreamSync(const CollectiveOptions& opts, v1::SubmitRequest* request,
                             internal::PendingRequest* pending);
  std::shared_ptr<ClientCore> core_;
  uint64_t handle_ = 0;
  int rank_ = 0;
  int nranks_ = 0;
  int nnodes_ = 1;
  uint64_t children_ = 0;  // Shrink and Grow calls so far: each child's id is derived from it
  // Joins the child-th child of `id` (Shrink, ShrinkLost): this communicator without `gone`,
  // renumbered, its id naming `coordinator` (empty: id's).
  absl::StatusOr<Comm> JoinShrunk(const std::string& id, uint64_t child, const std::set<int>& gone,
                                  const std::string& coordinator,
                                  std::chrono::milliseconds timeout) const;
  // Joins comm_id as rank of nranks (Client::InitComm, Shrink, Grow).
  static absl::StatusOr<Comm> Join(const std::shared_ptr<ClientCore>& core,
                                   const std::string& comm_id, int rank, int nranks,
                                   std::chrono::milliseconds timeout);
};

// Operations submitted on this thread between GroupStart() and GroupEnd() go to the daemon
// together, as one group (like ncclGroupStart/ncclGroupEnd): over the session rings they are
// published at once, and the daemon runs small one-node collectives of a group that agree on
// dtype and reduction as one operation, in order. Each returns its own Work, which completes
// after GroupEnd(); do not wait on one before GroupEnd() (it has not been submitted). Calls nest:
// the outermost GroupEnd() submits. Like NCCL's groups, a group never changes what the operations
// do, and every rank of a communicator must issue its collectives in the same order.
void GroupStart();
// Submits the thread's group; FAILED_PRECONDITION without a matching GroupStart().
absl::Status GroupEnd();

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options = {});
  ~Client();  // disconnects

  // Allocates size bytes of memory shared with the daemon (a sealed memfd, pre-faulted, passed by
  // descriptor) and registers it.
  absl::StatusOr<Buffer> Allocate(size_t size);
  // Allocates size bytes on CUDA device `device` (railyard/device_memory.h: a VMM allocation)
  // and registers them: the buffer's data() is a device pointer. Collectives on device buffers
  // run on the GPU, in the daemon (every buffer of an operation, every rank's, on that device).
  // FAILED_PRECONDITION when this client or the daemon has no CUDA devices.
  absl::StatusOr<Buffer> AllocateDevice(size_t size, int device);
  // Registers device memory allocated elsewhere: `exported_fd` is its allocation's descriptor
  // (cuMemExportToShareableHandle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; the caller keeps
  // and closes it), `size` bytes of it from the start, on `device`, which this process sees at
  // `device_ptr` (the buffer's data()). The memory must outlive the buffer.
  absl::StatusOr<Buffer> RegisterDeviceMemory(int exported_fd, size_t size, int device,
                                              void* device_ptr);
  // Registers `size` bytes of device memory at `device_ptr` on `device`, however it was allocated
  // (a framework's tensor): a VMM allocation by its descriptor, as above (from its start), other
  // memory (cudaMalloc's) by legacy CUDA IPC, which the daemon takes only with --cuda_ipc
  // (docs/gpu.md says why). The memory must outlive the buffer.
  absl::StatusOr<Buffer> RegisterDevicePointer(void* device_ptr, size_t size, int device);
  // Legacy CUDA IPC: `cuda_ipc_handle` is the cudaIpcMemHandle_t (64 bytes) of the allocation
  // holding the buffer, which starts `offset` bytes into it.
  absl::StatusOr<Buffer> RegisterCudaIpcMemory(std::string_view cuda_ipc_handle, uint64_t offset,
                                               size_t size, int device, void* device_ptr);
  // A fresh communicator id naming this daemon as coordinator (ncclGetUniqueId).
  absl::StatusOr<std::string> CreateCommId();
  // Joins comm_id as rank of nranks; returns when all ranks have joined.
  absl::StatusOr<Comm> InitComm(const std::string& comm_id, int rank, int nranks,
                                std::chrono::milliseconds timeout = std::chrono::milliseconds{0});

  const std::string& session_id() const;
  const std::string& node_name() const;
  // How many times the client moved its session to another railyardd: a handover (railyardd
  // --takeover) or a restart it waited out ($RAILYARD_RECONNECT_S; docs/restarts.md). Its
  // buffers, communicators and operations move with it.
  uint64_t reconnects() const;

 private:
  Client(std::shared_ptr<ClientCore> core, bool pool_small_buffers);
  Buffer DeviceBuffer(uint64_t id, void* device_ptr, size_t size, int device) const;
  // A buffer of its own (a memfd registered on its own), whatever its size.
  absl::StatusOr<Buffer> AllocateRegistered(size_t size);
  std::shared_ptr<ClientCore> core_;
  std::unique_ptr<internal::SmallPool> pool_;  // small Allocate()s
};

}  // namespace railyard
