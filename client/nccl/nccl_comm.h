// An NCCL communicator over a railyard communicator: initialization (blocking, or in the
// background for config.blocking = 0), operations with their memory resolved (nccl_memory.h),
// NCCL's group calls, asynchronous errors, PreMulSum ops, split and shrink.
//
// Completion follows NCCL's rules with one extension: host pointers are accepted where NCCL wants
// device memory. An operation on device memory is ordered on the caller's stream (the client's
// stream ordering) and the call returns at once. An operation on host memory completes before a
// blocking communicator's call returns (a group's at ncclGroupEnd); on a non-blocking
// communicator the call returns ncclInProgress while it runs, and ncclCommGetAsyncError says when
// it has completed.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "railyard/client.h"

namespace railyard::nccl {

struct PendingOp;

// What one communicator holds; ncclComm_t points at a holder of it (nccl_api.cc).
class CommState : public std::enable_shared_from_this<CommState> {
 public:
  enum class Phase { kInitializing, kReady, kFailed, kFinalized };

  CommState(std::string comm_id, int rank, int nranks, int cuda_device, bool blocking);
  ~CommState();

  const std::string& comm_id() const { return comm_id_; }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int cuda_device() const { return cuda_device_; }
  bool blocking() const { return blocking_; }

  // Joins the railyard communicator: now (blocking, outside a group) or on a thread of its own
  // (non-blocking: ncclInProgress; inside a group: ncclSuccess, and ncclGroupEnd waits).
  ncclResult_t Init(bool in_group);
  // The join's result once it ended (poll: ncclInProgress while it runs).
  ncclResult_t WaitInit(bool poll);
  Phase phase() const;
  // ncclCommGetAsyncError: finishes what completed; ncclInProgress while initializing or while
  // operations run, else the first error (sticky) or ncclSuccess.
  ncclResult_t AsyncError();
  // Records a failure that ends the communicator's usefulness (NCCL's async error).
  void SetAsyncError(ncclResult_t r, const std::string& why);
  // ncclSuccess, or why operations cannot be launched now.
  ncclResult_t CheckUsable(const char* call);

  // Waits for (blocking) or polls (non-blocking) every operation not yet finished; then no more
  // may be launched. ncclInProgress while a non-blocking one still runs.
  ncclResult_t Finalize();
  // Leaves the railyard communicator without waiting (ncclCommAbort), or after finalizing.
  ncclResult_t Destroy(bool abort);

  Comm& comm() { return comm_; }
  // A launched operation that a non-blocking communicator finishes later.
  void Track(std::shared_ptr<PendingOp> op);

  // PreMulSum ops: index of a created one, or -1.
  struct PreMulSum {
    bool live = false;
    ncclDataType_t dtype = ncclFloat32;
    ncclScalarResidence_t residence = ncclScalarHostImmediate;
    uint64_t value = 0;           // host immediate: the scalar's bytes
    const void* where = nullptr;  // device residence: read at each operation
  };
  ncclResult_t CreatePreMulSum(ncclRedOp_t* op, const void* scalar, ncclDataType_t dtype,
                               ncclScalarResidence_t residence);
  ncclResult_t DestroyPreMulSum(ncclRedOp_t op);
  // The PreMulSum behind op, or false.
  bool PreMulSumOf(ncclRedOp_t op, PreMulSum* out);

  uint64_t NextSplit() { return ++splits_; }

 private:
  const std::string comm_id_;
  const int rank_;
  const int nranks_;
  const int cuda_device_;
  const bool blocking_;
  Comm comm_;
  uint64_t splits_ = 0;  // children made (every rank counts alike: split and shrink are collective)

  mutable absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kInitializing;
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;                     // aborted while the join ran
  ncclResult_t init_result_ ABSL_GUARDED_BY(mu_) = ncclInProgress;  // a join on its own thread
  absl::Notification init_done_;
  ncclResult_t async_error_ ABSL_GUARDED_BY(mu_) = ncclSuccess;
  std::string async_why_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<PendingOp>> outstanding_ ABSL_GUARDED_BY(mu_);
  std::vector<PreMulSum> premul_ ABSL_GUARDED_BY(mu_);
};

// An operation as NCCL calls it, before railyard's shapes.
enum class Kind {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSend,
  kRecv
};
struct OpCall {
  const char* name = "";
  Kind kind = Kind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // NCCL's count for the call (sendcount, recvcount, per-peer count)
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = 0;  // root, or peer for send/recv
};

// Checks, resolves and launches an operation on comm (stream: the caller's cudaStream_t).
ncclResult_t Launch(CommState* comm, const OpCall& call, cudaStream_t stream);
// ncclGroupStart / ncclGroupEnd.
ncclResult_t GroupStart();
ncclResult_t GroupEnd();
bool InGroup();

}  // namespace railyard::nccl
