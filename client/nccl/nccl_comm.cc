#include "client/nccl/nccl_comm.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/nccl/nccl_convert.h"
#include "client/nccl/nccl_memory.h"
#include "client/nccl/nccl_process.h"

namespace railyard::nccl {

// One launched operation and what it holds until it has finished.
struct PendingOp {
  CommState* comm = nullptr;  // outlives it: Finalize and Destroy finish every tracked op
  std::string name;
  bool device = false;
  Work work;
  std::shared_ptr<const Buffer> send_hold, recv_hold;  // resolved (registered) memory
  std::shared_ptr<Buffer> send_stage, recv_stage;      // staged host memory
  void* copy_out = nullptr;  // where recv_stage's bytes go once it completed
  size_t copy_bytes = 0;
  bool finished = false;
  ncclResult_t result = ncclSuccess;
};

namespace {

thread_local int group_depth = 0;
thread_local std::vector<std::shared_ptr<PendingOp>> group_ops;
// Communicators initialized inside the thread's group: ncclGroupEnd waits for their joins.
thread_local std::vector<std::shared_ptr<CommState>> group_inits;

// Waits (or, with poll, only looks) for op; copies a staged result out and lets its memory go.
// True once finished.
bool Finish(PendingOp& op, bool poll) {
  if (op.finished) return true;
  if (poll && !op.work.test()) return false;
  const absl::Status s = op.work.wait();
  if (s.ok() && op.copy_out != nullptr && op.copy_bytes > 0) {
    std::memcpy(op.copy_out, op.recv_stage->data(), op.copy_bytes);
  }
  op.send_stage.reset();
  op.recv_stage.reset();
  op.send_hold.reset();
  op.recv_hold.reset();
  op.finished = true;
  op.result = ResultOf(s);
  if (!s.ok()) {
    const std::string why =
        absl::StrCat(op.name, " on rank ", op.comm->rank(),
                     " failed: ", s.ToString(absl::StatusToStringMode::kWithNoExtraData));
    // Disagreements and bad arguments are the call's; the rest end the communicator (NCCL's
    // asynchronous errors).
    if (op.result != ncclInvalidArgument && op.result != ncclInvalidUsage) {
      op.comm->SetAsyncError(op.result, why);
    }
    Fail(op.result, why);
  }
  return true;
}

struct Shape {
  size_t send_bytes = 0;
  size_t recv_bytes = 0;
};

Shape ShapeOf(const OpCall& c, size_t e, int rank, int nranks) {
  const size_t one = c.count * e;
  const size_t all = one * static_cast<size_t>(nranks);
  switch (c.kind) {
    case Kind::kAllReduce:
      return {one, one};
    case Kind::kBroadcast:
      return {rank == c.root ? one : 0, one};
    case Kind::kReduce:
      return {one, rank == c.root ? one : 0};
    case Kind::kAllGather:
      return {one, all};
    case Kind::kReduceScatter:
      return {all, one};
    case Kind::kAllToAll:
      return {all, all};
    case Kind::kSend:
      return {one, 0};
    case Kind::kRecv:
      return {0, one};
  }
  return {};
}

bool Reduces(Kind k) {
  return k == Kind::kAllReduce || k == Kind::kReduce || k == Kind::kReduceScatter;
}

}  // namespace

CommState::CommState(std::string comm_id, int rank, int nranks, int cuda_device, bool blocking)
    : comm_id_(std::move(comm_id)),
      rank_(rank),
      nranks_(nranks),
      cuda_device_(cuda_device),
      blocking_(blocking) {}

CommState::~CommState() = default;

ncclResult_t CommState::Init(bool in_group) {
  LogVersionOnce();
  auto join = [](const std::shared_ptr<CommState>& self) -> ncclResult_t {
    absl::StatusOr<Client*> client = ProcessClient();
    absl::StatusOr<Comm> joined =
        client.ok() ? (*client)->InitComm(self->comm_id_, self->rank_, self->nranks_)
                    : absl::StatusOr<Comm>(client.status());
    if (!joined.ok()) {
      const ncclResult_t r = ResultOf(joined.status());
      const std::string why =
          absl::StrCat("rank ", self->rank_, " of ", self->nranks_, " could not join ",
                       self->comm_id_, ": ", joined.status().message());
      self->SetAsyncError(r == ncclInvalidArgument ? ncclInvalidArgument : r, why);
      return Fail(r, why);
    }
    absl::MutexLock lock(&self->mu_);
    self->comm_ = std::move(*joined);
    if (self->abandoned_) {
      self->comm_.Destroy().IgnoreError();
      self->phase_ = Phase::kFailed;
      return ncclInvalidUsage;
    }
    self->phase_ = Phase::kReady;
    Log(DebugLevel::kInfo, self->rank_,
        absl::StrCat("Init COMPLETE comm ", self->comm_id_, " rank ", self->rank_, " nranks ",
                     self->nranks_, " nnodes ", self->comm_.nnodes(), " - railyard"));
    return ncclSuccess;
  };
  if (blocking_ && !in_group) return join(shared_from_this());
  // Non-blocking, or inside a group (NCCL's way to initialize several ranks from one thread:
  // each join waits for the others, so they run at once and ncclGroupEnd waits for them).
  std::thread([join, self = shared_from_this()] {
    const ncclResult_t r = join(self);
    {
      absl::MutexLock lock(&self->mu_);
      self->init_result_ = r;
    }
    self->init_done_.Notify();
  }).detach();
  if (in_group) {
    group_inits.push_back(shared_from_this());
    return ncclSuccess;
  }
  return ncclInProgress;
}

ncclResult_t CommState::WaitInit(bool poll) {
  if (poll && !init_done_.HasBeenNotified()) return ncclInProgress;
  init_done_.WaitForNotification();
  absl::MutexLock lock(&mu_);
  return init_result_;
}

CommState::Phase CommState::phase() const {
  absl::MutexLock lock(&mu_);
  return phase_;
}

void CommState::SetAsyncError(ncclResult_t r, const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (async_error_ == ncclSuccess) {
    async_error_ = r;
    async_why_ = why;
  }
  if (phase_ == Phase::kInitializing) phase_ = Phase::kFailed;
}

ncclResult_t CommState::AsyncError() {
  std::deque<std::shared_ptr<PendingOp>> ops;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kInitializing) return ncclInProgress;
    ops = outstanding_;
  }
  bool running = false;
  for (auto& op : ops) running |= !Finish(*op, /*poll=*/true);
  absl::MutexLock lock(&mu_);
  while (!outstanding_.empty() && outstanding_.front()->finished) outstanding_.pop_front();
  if (async_error_ != ncclSuccess) return async_error_;
  return running ? ncclInProgress : ncclSuccess;
}

ncclResult_t CommState::CheckUsable(const char* call) {
  absl::MutexLock lock(&mu_);
  switch (phase_) {
    case Phase::kInitializing:
      return Fail(ncclInvalidUsage,
                  absl::StrCat(call, ": communicator ", comm_id_,
                               " is still initializing: poll ncclCommGetAsyncError until it "
                               "returns ncclSuccess"));
    case Phase::kFinalized:
      return Fail(ncclInvalidUsage,
                  absl::StrCat(call, ": communicator ", comm_id_, " was finalized"));
    case Phase::kFailed:
    case Phase::kReady:
      break;
  }
  if (async_error_ != ncclSuccess) {
    return Fail(async_error_, absl::StrCat(call, ": communicator ", comm_id_,
                                           " has an asynchronous error (abort it): ", async_why_));
  }
  return ncclSuccess;
}

void CommState::Track(std::shared_ptr<PendingOp> op) {
  absl::MutexLock lock(&mu_);
  outstanding_.push_back(std::move(op));
}

ncclResult_t CommState::Finalize() {
  std::deque<std::shared_ptr<PendingOp>> ops;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kInitializing) {
      return Fail(ncclInvalidUsage, "ncclCommFinalize: the communicator is still initializing");
    }
    if (phase_ == Phase::kReady) phase_ = Phase::kFinalized;
    ops = outstanding_;
  }
  bool running = false;
  for (auto& op : ops) running |= !Finish(*op, /*poll=*/!blocking_);
  absl::MutexLock lock(&mu_);
  while (!outstanding_.empty() && outstanding_.front()->finished) outstanding_.pop_front();
  if (running) return ncclInProgress;
  return async_error_;
}

ncclResult_t CommState::Destroy(bool abort) {
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kInitializing) {
      // The join runs on its own thread (non-blocking init): it leaves when it ends.
      abandoned_ = true;
      return ncclSuccess;
    }
  }
  if (!abort) {
    // Destroy waits for what was launched (it finalizes, as NCCL does, if the caller did not).
    std::deque<std::shared_ptr<PendingOp>> ops;
    {
      absl::MutexLock lock(&mu_);
      ops = outstanding_;
    }
    for (auto& op : ops) Finish(*op, /*poll=*/false);
  }
  absl::Status left = comm_.Destroy();
  std::deque<std::shared_ptr<PendingOp>> ops;
  {
    absl::MutexLock lock(&mu_);
    ops.swap(outstanding_);
    phase_ = Phase::kFinalized;
  }
  // Aborted: what still runs fails now (the daemon aborts the communicator for its other ranks
  // too); wait, bounded, before the staging memory goes.
  for (auto& op : ops) {
    if (!op->finished) op->work.wait(std::chrono::seconds(10)).IgnoreError();
    op->send_stage.reset();
    op->recv_stage.reset();
  }
  if (!left.ok()) {
    // The rank is gone from the communicator either way (a daemon that went away, a communicator
    // that had failed): NCCL's destroy frees what it holds and succeeds; say why in the log.
    Log(DebugLevel::kWarn, rank_,
        absl::StrCat("ncclCommDestroy: leaving ", comm_id_, ": ", left.message()));
  }
  return ncclSuccess;
}

ncclResult_t CommState::CreatePreMulSum(ncclRedOp_t* op, const void* scalar, ncclDataType_t dtype,
                                        ncclScalarResidence_t residence) {
  PreMulSum p;
  p.live = true;
  p.dtype = dtype;
  p.residence = residence;
  if (residence == ncclScalarHostImmediate) {
    std::memcpy(&p.value, scalar, ElementBytes(dtype));
  } else {
    p.where = scalar;
  }
  absl::MutexLock lock(&mu_);
  size_t i = 0;
  while (i < premul_.size() && premul_[i].live) ++i;
  if (i == premul_.size()) premul_.emplace_back();
  premul_[i] = p;
  *op = static_cast<ncclRedOp_t>(static_cast<int>(ncclNumOps) + static_cast<int>(i));
  return ncclSuccess;
}

ncclResult_t CommState::DestroyPreMulSum(ncclRedOp_t op) {
  absl::MutexLock lock(&mu_);
  const int i = static_cast<int>(op) - static_cast<int>(ncclNumOps);
  if (i < 0 || static_cast<size_t>(i) >= premul_.size() || !premul_[i].live) {
    return Fail(ncclInvalidArgument,
                absl::StrCat("ncclRedOpDestroy: op ", static_cast<int>(op),
                             " is not a PreMulSum op created on this communicator"));
  }
  premul_[i].live = false;
  return ncclSuccess;
}

bool CommState::PreMulSumOf(ncclRedOp_t op, PreMulSum* out) {
  absl::MutexLock lock(&mu_);
  const int i = static_cast<int>(op) - static_cast<int>(ncclNumOps);
  if (i < 0 || static_cast<size_t>(i) >= premul_.size() || !premul_[i].live) return false;
  *out = premul_[i];
  return true;
}

ncclResult_t Launch(CommState* c, const OpCall& call, cudaStream_t stream) {
  if (c == nullptr) return Fail(ncclInvalidArgument, absl::StrCat(call.name, ": comm is NULL"));
  if (ncclResult_t r = c->CheckUsable(call.name); r != ncclSuccess) return r;
  DataType dtype;
  std::string why;
  if (ncclResult_t r = ToDataType(call.dtype, &dtype, &why); r != ncclSuccess) {
    return Fail(r, absl::StrCat(call.name, ": ", why));
  }
  RedOp red = RedOp::kSum;
  CommState::PreMulSum premul;
  bool scaled = false;
  if (Reduces(call.kind) && !ToRedOp(call.op, &red)) {
    if (!c->PreMulSumOf(call.op, &premul)) {
      return Fail(ncclInvalidArgument,
                  absl::StrCat(call.name, ": invalid reduction op ", static_cast<int>(call.op)));
    }
    if (premul.dtype != call.dtype) {
      return Fail(ncclInvalidArgument,
                  absl::StrCat(call.name, ": PreMulSum op ", static_cast<int>(call.op),
                               " was created for datatype ", static_cast<int>(premul.dtype),
                               ", not ", static_cast<int>(call.dtype)));
    }
    scaled = true;
  }
  const bool rooted = call.kind == Kind::kBroadcast || call.kind == Kind::kReduce;
  const bool p2p = call.kind == Kind::kSend || call.kind == Kind::kRecv;
  if ((rooted || p2p) && (call.root < 0 || call.root >= c->nranks())) {
    return Fail(ncclInvalidArgument, absl::StrCat(call.name, ": ", p2p ? "peer " : "root ",
                                                  call.root, " not in [0, ", c->nranks(), ")"));
  }
  const size_t e = ElementBytes(call.dtype);
  const Shape shape = ShapeOf(call, e, c->rank(), c->nranks());
  if (call.count > (size_t{1} << 46) / e) {
    return Fail(ncclInvalidArgument, absl::StrCat(call.name, ": count ", call.count, " too large"));
  }
  if (shape.send_bytes > 0 && call.send == nullptr) {
    return Fail(ncclInvalidArgument, absl::StrCat(call.name, ": sendbuff is NULL"));
  }
  if (shape.recv_bytes > 0 && call.recv == nullptr) {
    return Fail(ncclInvalidArgument, absl::StrCat(call.name, ": recvbuff is NULL"));
  }
  if (call.count == 0) return ncclSuccess;  // every rank passes the same count: nothing to do

  auto op = std::make_shared<PendingOp>();
  op->comm = c;
  op->name = call.name;
  Resolved send, recv;
  if (shape.send_bytes > 0) {
    absl::StatusOr<Resolved> r = Resolve(call.send, shape.send_bytes);
    if (!r.ok())
      return Fail(ResultOf(r.status()), absl::StrCat(call.name, ": ", r.status().message()));
    send = *r;
  }
  if (shape.recv_bytes > 0) {
    absl::StatusOr<Resolved> r = Resolve(call.recv, shape.recv_bytes);
    if (!r.ok())
      return Fail(ResultOf(r.status()), absl::StrCat(call.name, ": ", r.status().message()));
    recv = *r;
  }
  const bool device = send.device || recv.device;
  if (device &&
      ((shape.send_bytes > 0 && !send.device) || (shape.recv_bytes > 0 && !recv.device))) {
    return Fail(ncclInvalidUsage,
                absl::StrCat(call.name,
                             ": one buffer is device memory and the other host memory; "
                             "railyard runs an operation on one kind"));
  }
  if (device && scaled) {
    return Fail(ncclInvalidUsage,
                absl::StrCat(call.name,
                             ": PreMulSum ops on device memory are not supported by "
                             "railyard's NCCL library (host memory only)"));
  }
  if (!device && stream != nullptr) {
    // Host memory on a stream: what the stream had enqueued comes first.
    if (cudaStreamSynchronize(stream) != cudaSuccess) {
      return Fail(ncclUnhandledCudaError, absl::StrCat(call.name, ": cudaStreamSynchronize: ",
                                                       cudaGetErrorString(cudaGetLastError())));
    }
  }
  // Each side: the resolved memory in place, or a staging buffer (the send side filled now).
  auto side = [&](const Resolved& r, size_t bytes, bool in_place,
                  std::shared_ptr<const Buffer>* hold, std::shared_ptr<Buffer>* stage,
                  BufferRef* ref) -> ncclResult_t {
    if (bytes == 0) return ncclSuccess;
    if (r.buffer != nullptr && in_place) {
      *hold = r.buffer;
      *ref = BufferRef(*r.buffer, r.offset);
      return ncclSuccess;
    }
    absl::StatusOr<std::shared_ptr<Buffer>> taken = TakeStaging(bytes);
    if (!taken.ok()) {
      return Fail(ResultOf(taken.status()),
                  absl::StrCat(call.name, ": staging: ", taken.status().message()));
    }
    *stage = *std::move(taken);
    *ref = BufferRef(**stage, 0);
    return ncclSuccess;
  };
  BufferRef send_ref, recv_ref;
  if (ncclResult_t r =
          side(send, shape.send_bytes, !scaled, &op->send_hold, &op->send_stage, &send_ref);
      r != ncclSuccess) {
    return r;
  }
  if (op->send_stage != nullptr) {
    std::memcpy(op->send_stage->data(), call.send, shape.send_bytes);
    if (scaled) {
      const void* scalar = premul.residence == ncclScalarHostImmediate
                               ? static_cast<const void*>(&premul.value)
                               : premul.where;
      Scale(op->send_stage->data(), shape.send_bytes / e, call.dtype, scalar);
    }
  }
  if (ncclResult_t r =
          side(recv, shape.recv_bytes, true, &op->recv_hold, &op->recv_stage, &recv_ref);
      r != ncclSuccess) {
    return r;
  }
  if (op->recv_stage != nullptr) {
    op->copy_out = call.recv;
    op->copy_bytes = shape.recv_bytes;
  }
  op->device = device;
  CollectiveOptions opts;
  opts.algo = ForcedAlgorithm();
  if (device) opts.stream = stream;
  Comm& comm = c->comm();
  switch (call.kind) {
    case Kind::kAllReduce:
      op->work = comm.AllReduce(send_ref, recv_ref, call.count, dtype, red, opts);
      break;
    case Kind::kBroadcast:
      op->work = comm.Broadcast(send_ref, recv_ref, call.count, dtype, call.root, opts);
      break;
    case Kind::kReduce:
      op->work = comm.Reduce(send_ref, recv_ref, call.count, dtype, red, call.root, opts);
      break;
    case Kind::kAllGather:
      op->work = comm.AllGather(send_ref, recv_ref, call.count, dtype, opts);
      break;
    case Kind::kReduceScatter:
      op->work = comm.ReduceScatter(send_ref, recv_ref, call.count, dtype, red, opts);
      break;
    case Kind::kAllToAll:
      op->work = comm.AllToAll(send_ref, recv_ref, call.count, dtype, opts);
      break;
    case Kind::kSend:
      op->work = comm.Send(send_ref, call.count, dtype, call.root, opts);
      break;
    case Kind::kRecv:
      op->work = comm.Recv(recv_ref, call.count, dtype, call.root, opts);
      break;
  }
  if (group_depth > 0) {
    group_ops.push_back(std::move(op));
    return ncclSuccess;
  }
  if (c->blocking() && !device) {
    Finish(*op, /*poll=*/false);
    return op->result;
  }
  c->Track(op);
  if (device) return ncclSuccess;  // ordered on the stream
  return Finish(*op, /*poll=*/true) ? op->result : ncclInProgress;
}

ncclResult_t GroupStart() {
  ++group_depth;
  railyard::GroupStart();
  return ncclSuccess;
}

bool InGroup() { return group_depth > 0; }

ncclResult_t GroupEnd() {
  if (group_depth == 0) {
    return Fail(ncclInvalidUsage, "ncclGroupEnd: no group is open (ncclGroupStart first)");
  }
  --group_depth;
  if (absl::Status s = railyard::GroupEnd(); !s.ok()) {
    return Fail(ncclInternalError, absl::StrCat("ncclGroupEnd: ", s.message()));
  }
  if (group_depth > 0) return ncclSuccess;
  std::vector<std::shared_ptr<PendingOp>> ops;
  ops.swap(group_ops);
  std::vector<std::shared_ptr<CommState>> inits;
  inits.swap(group_inits);
  ncclResult_t first = ncclSuccess;
  bool running = false;
  for (auto& c : inits) {
    const ncclResult_t r = c->WaitInit(/*poll=*/!c->blocking());
    if (r == ncclInProgress) {
      running = true;
    } else if (r != ncclSuccess && first == ncclSuccess) {
      first = r;
    }
  }
  for (auto& op : ops) {
    if (op->comm->blocking() && !op->device) {
      Finish(*op, /*poll=*/false);
    } else {
      op->comm->Track(op);
      if (!op->device && !Finish(*op, /*poll=*/true)) running = true;
    }
    if (op->finished && op->result != ncclSuccess && first == ncclSuccess) first = op->result;
  }
  if (first != ncclSuccess) return first;
  return running ? ncclInProgress : ncclSuccess;
}

}  // namespace railyard::nccl
