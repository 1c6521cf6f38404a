// The NCCL 2.x C API (the CUDA toolkit's nccl.h) over railyard: argument checks with NCCL's
// result codes, then nccl_comm.h. Each pnccl* name is an alias of its nccl* (NCCL's profiling
// interface). What railyard cannot do returns ncclInvalidUsage and says why in ncclGetLastError.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cpp/derived_comm_id.h"
#include "client/nccl/nccl_comm.h"
#include "client/nccl/nccl_convert.h"
#include "client/nccl/nccl_memory.h"
#include "client/nccl/nccl_process.h"
#include "client/nccl/unique_id.h"

using railyard::nccl::CommState;
using railyard::nccl::DebugLevel;
using railyard::nccl::Fail;
using railyard::nccl::Kind;
using railyard::nccl::OpCall;

// What ncclComm_t points at.
struct ncclComm {
  std::shared_ptr<CommState> s;
};

namespace {

// A registration (ncclCommRegister): the memory it keeps registered, if any.
struct Registration {
  std::shared_ptr<const railyard::Buffer> buffer;
};
std::mutex registrations_mu;
std::set<Registration*>* registrations = new std::set<Registration*>();

bool Blocking(const ncclConfig_t* config) {
  if (config != nullptr && config->blocking != NCCL_CONFIG_UNDEF_INT) return config->blocking != 0;
  const char* env = std::getenv("NCCL_COMM_BLOCKING");
  return env == nullptr || std::string(env) != "0";
}

int CurrentDevice() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return 0;  // no CUDA here: device 0, as NCCL's default
  }
  return d;
}

ncclResult_t CheckConfig(const ncclConfig_t* config) {
  if (config == nullptr) return ncclSuccess;
  if (config->magic != 0xcafebeef) {
    return Fail(ncclInvalidArgument,
                "config was not initialized with NCCL_CONFIG_INITIALIZER (bad magic)");
  }
  if (config->size < offsetof(ncclConfig_t, blocking) + sizeof(int)) {
    return Fail(ncclInvalidArgument, absl::StrCat("config size ", config->size, " too small"));
  }
  return ncclSuccess;
}

ncclResult_t InitRank(ncclComm_t* out, int nranks, const std::string& comm_id, int rank,
                      const ncclConfig_t* config, int device) {
  if (out == nullptr) return Fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *out = nullptr;
  if (nranks < 1) {
    return Fail(ncclInvalidArgument, absl::StrCat("ncclCommInitRank: nranks ", nranks, " < 1"));
  }
  if (rank < 0 || rank >= nranks) {
    return Fail(ncclInvalidArgument,
                absl::StrCat("ncclCommInitRank: rank ", rank, " not in [0, ", nranks, ")"));
  }
  if (ncclResult_t r = CheckConfig(config); r != ncclSuccess) return r;
  auto state = std::make_shared<CommState>(comm_id, rank, nranks, device, Blocking(config));
  const ncclResult_t r = state->Init(railyard::nccl::InGroup());
  if (r != ncclSuccess && r != ncclInProgress) return r;
  *out = new ncclComm{std::move(state)};
  return r;
}

ncclResult_t CommIdFromUniqueId(const ncclUniqueId& id, std::string* out) {
  absl::StatusOr<std::string> text = railyard::nccl::DecodeUniqueId(id);
  if (!text.ok()) return Fail(ncclInvalidArgument, std::string(text.status().message()));
  *out = *text;
  return ncclSuccess;
}

CommState* S(ncclComm_t comm) { return comm == nullptr ? nullptr : comm->s.get(); }

ncclResult_t Coll(const OpCall& call, ncclComm_t comm, cudaStream_t stream) {
  return railyard::nccl::Launch(S(comm), call, stream);
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return Fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (unique_id == nullptr) return Fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  railyard::nccl::LogVersionOnce();
  std::string comm_id;
  if (const char* at = std::getenv("NCCL_COMM_ID"); at != nullptr && *at != '\0') {
    // Every rank derives the same id: coordinated by the railyardd whose peer service is there.
    const char* job = std::getenv("RAILYARD_JOB");
    comm_id = railyard::nccl::CommIdAt(at, job == nullptr ? "default" : job);
  } else {
    absl::StatusOr<railyard::Client*> client = railyard::nccl::ProcessClient();
    if (!client.ok()) {
      return Fail(
          railyard::nccl::ResultOf(client.status()),
          absl::StrCat("ncclGetUniqueId: no railyardd to ask: ", client.status().message()));
    }
    absl::StatusOr<std::string> made = (*client)->CreateCommId();
    if (!made.ok()) {
      return Fail(railyard::nccl::ResultOf(made.status()),
                  absl::StrCat("ncclGetUniqueId: ", made.status().message()));
    }
    comm_id = *made;
  }
  absl::StatusOr<ncclUniqueId> id = railyard::nccl::EncodeUniqueId(comm_id);
  if (!id.ok()) return Fail(ncclInternalError, std::string(id.status().message()));
  *unique_id = *id;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config) {
  std::string id;
  if (ncclResult_t r = CommIdFromUniqueId(comm_id, &id); r != ncclSuccess) {
    if (comm != nullptr) *comm = nullptr;
    return r;
  }
  return InitRank(comm, nranks, id, rank, config, CurrentDevice());
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, comm_id, rank, nullptr);
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int n_id,
                                      ncclUniqueId* comm_ids, ncclConfig_t* config) {
  if (n_id < 1 || comm_ids == nullptr) {
    return Fail(ncclInvalidArgument, "ncclCommInitRankScalable: needs at least one unique id");
  }
  // One coordinator serves every rank here: the first id names it.
  return ncclCommInitRankConfig(comm, nranks, comm_ids[0], rank, config);
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr) return Fail(ncclInvalidArgument, "ncclCommInitAll: comms is NULL");
  if (ndev < 1) return Fail(ncclInvalidArgument, absl::StrCat("ncclCommInitAll: ndev ", ndev));
  ncclUniqueId uid;
  if (ncclResult_t r = ncclGetUniqueId(&uid); r != ncclSuccess) return r;
  std::string id;
  if (ncclResult_t r = CommIdFromUniqueId(uid, &id); r != ncclSuccess) return r;
  std::vector<ncclResult_t> results(ndev, ncclSuccess);
  std::vector<std::thread> threads;
  for (int i = 0; i < ndev; ++i) {
    threads.emplace_back([&, i] {
      results[i] = InitRank(&comms[i], ndev, id, i, nullptr, devlist == nullptr ? i : devlist[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < ndev; ++i) {
    if (results[i] != ncclSuccess) {
      for (int j = 0; j < ndev; ++j) {
        if (comms[j] != nullptr) comms[j]->s->Destroy(/*abort=*/true);
        delete comms[j];
        comms[j] = nullptr;
      }
      return results[i];
    }
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return Fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  return comm->s->Finalize();
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL: destroying NULL is a no-op
  const ncclResult_t r = comm->s->Destroy(/*abort=*/false);
  delete comm;
  return r;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  comm->s->Destroy(/*abort=*/true);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revoke_flags) {
  return Fail(ncclInvalidUsage,
              "ncclCommRevoke is not supported by railyard's NCCL library: abort the "
              "communicator (ncclCommAbort) instead");
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  if (comm == nullptr || newcomm == nullptr) {
    return Fail(ncclInvalidArgument, "ncclCommSplit: comm or newcomm is NULL");
  }
  *newcomm = nullptr;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return Fail(ncclInvalidArgument, absl::StrCat("ncclCommSplit: color ", color, " < 0"));
  }
  if (railyard::nccl::InGroup()) {
    return Fail(ncclInvalidUsage, "ncclCommSplit inside a group is not supported by railyard");
  }
  CommState* s = comm->s.get();
  if (ncclResult_t r = s->CheckUsable("ncclCommSplit"); r != ncclSuccess) return r;
  // Every rank's (color, key), gathered over the parent.
  const int n = s->nranks();
  std::vector<int32_t> mine = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(n));
  OpCall gather{"ncclCommSplit", Kind::kAllGather, mine.data(), all.data(), 2, ncclInt32};
  // Blocking, whatever the parent's mode: the split needs the answer now.
  const bool blocking = s->blocking();
  ncclResult_t r = railyard::nccl::Launch(s, gather, nullptr);
  while (!blocking && r == ncclInProgress) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    r = s->AsyncError();
  }
  if (r != ncclSuccess) return r;
  const uint64_t split = s->NextSplit();
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  std::vector<std::pair<int32_t, int>> members;  // (key, parent rank) of my color
  for (int i = 0; i < n; ++i) {
    if (all[2 * i] == color) members.push_back({all[2 * i + 1], i});
  }
  std::sort(members.begin(), members.end());
  int newrank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == s->rank()) newrank = static_cast<int>(i);
  }
  const std::string child =
      railyard::internal::DerivedCommId(s->comm_id(), absl::StrCat("split/", split, "/", color));
  if (ncclResult_t c = CheckConfig(config); c != ncclSuccess) return c;
  if (config == nullptr) {
    ncclConfig_t inherit = NCCL_CONFIG_INITIALIZER;
    inherit.blocking = blocking ? 1 : 0;
    return InitRank(newcomm, static_cast<int>(members.size()), child, newrank, &inherit,
                    s->cuda_device());
  }
  return InitRank(newcomm, static_cast<int>(members.size()), child, newrank, config,
                  s->cuda_device());
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int* exclude, int exclude_count, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrink_flags) {
  if (comm == nullptr || newcomm == nullptr) {
    return Fail(ncclInvalidArgument, "ncclCommShrink: comm or newcomm is NULL");
  }
  *newcomm = nullptr;
  if (exclude_count < 0 || (exclude_count > 0 && exclude == nullptr)) {
    return Fail(ncclInvalidArgument, "ncclCommShrink: bad excludeRanksList/excludeRanksCount");
  }
  CommState* s = comm->s.get();
  std::set<int> gone;
  for (int i = 0; i < exclude_count; ++i) {
    if (exclude[i] < 0 || exclude[i] >= s->nranks()) {
      return Fail(ncclInvalidArgument, absl::StrCat("ncclCommShrink: excluded rank ", exclude[i],
                                                    " not in [0, ", s->nranks(), ")"));
    }
    gone.insert(exclude[i]);
  }
  if (gone.count(s->rank()) != 0) {
    return Fail(ncclInvalidArgument,
                absl::StrCat("ncclCommShrink: rank ", s->rank(), " is in its own exclude list"));
  }
  if (static_cast<int>(gone.size()) == s->nranks()) {
    return Fail(ncclInvalidArgument, "ncclCommShrink: every rank excluded");
  }
  // Survivors renumber in order and derive the child's id alike, without the excluded ranks.
  int newrank = s->rank();
  for (int g : gone) newrank -= g < s->rank() ? 1 : 0;
  const uint64_t split = s->NextSplit();
  if (ncclResult_t c = CheckConfig(config); c != ncclSuccess) return c;
  // The coordinator's node may be among the excluded (dead): the daemon names the survivors'.
  // Where it cannot say (a communicator still joining), the parent's, as before it could.
  absl::StatusOr<std::string> coordinator =
      s->comm().ShrinkCoordinator(std::vector<int>(gone.begin(), gone.end()));
  const std::string child = railyard::internal::DerivedCommId(
      s->comm_id(), absl::StrCat("shrink/", split, "/", absl::StrJoin(gone, ",")),
      coordinator.ok() ? *coordinator : std::string());
  return InitRank(newcomm, s->nranks() - static_cast<int>(gone.size()), child, newrank, config,
                  s->cuda_device());
}

const char* ncclGetErrorString(ncclResult_t result) { return railyard::nccl::ErrorString(result); }

const char* ncclGetLastError(ncclComm_t comm) { return railyard::nccl::LastError(); }

void ncclResetDebugInit() {}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) {
    return Fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
  }
  *async_error = comm->s->AsyncError();
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) {
    return Fail(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
  }
  *count = comm->s->nranks();
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) {
    return Fail(ncclInvalidArgument, "ncclCommCuDevice: comm or device is NULL");
  }
  *device = comm->s->cuda_device();
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) {
    return Fail(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
  }
  *rank = comm->s->rank();
  return ncclSuccess;
}

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return Fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  absl::StatusOr<void*> p = railyard::nccl::MemAlloc(size);
  if (!p.ok()) {
    return Fail(absl::IsResourceExhausted(p.status()) ? ncclSystemError
                                                      : railyard::nccl::ResultOf(p.status()),
                absl::StrCat("ncclMemAlloc(", size, "): ", p.status().message()));
  }
  *ptr = *p;
  return ncclSuccess;
}

ncclResult_t ncclMemFree(void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  if (absl::Status s = railyard::nccl::MemFree(ptr); !s.ok()) {
    return Fail(ncclInvalidArgument, std::string(s.message()));
  }
  return ncclSuccess;
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  if (comm == nullptr || buff == nullptr || handle == nullptr || size == 0) {
    return Fail(ncclInvalidArgument, "ncclCommRegister: comm, buff or handle is NULL, or size 0");
  }
  absl::StatusOr<railyard::nccl::Resolved> r = railyard::nccl::Resolve(buff, size);
  if (!r.ok()) {
    return Fail(railyard::nccl::ResultOf(r.status()),
                absl::StrCat("ncclCommRegister: ", r.status().message()));
  }
  if (r->buffer == nullptr) {
    // Plain host memory cannot be mapped by the daemon: its operations stay staged (copied).
    railyard::nccl::Log(DebugLevel::kInfo, comm->s->rank(),
                        absl::StrCat("ncclCommRegister: ", railyard::nccl::Ptr(buff),
                                     " is host memory railyardd cannot map; operations on it "
                                     "are staged (use ncclMemAlloc for zero copy)"));
  }
  auto* reg = new Registration{r->buffer};
  std::lock_guard<std::mutex> lock(registrations_mu);
  registrations->insert(reg);
  *handle = reg;
  return ncclSuccess;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  if (comm == nullptr) return Fail(ncclInvalidArgument, "ncclCommDeregister: comm is NULL");
  std::lock_guard<std::mutex> lock(registrations_mu);
  auto* reg = static_cast<Registration*>(handle);
  if (registrations->erase(reg) == 0) {
    return Fail(ncclInvalidArgument, "ncclCommDeregister: handle is not a live registration");
  }
  delete reg;
  return ncclSuccess;
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int win_flags) {
  return Fail(ncclInvalidUsage,
              "ncclCommWindowRegister: symmetric memory windows are not supported by railyard's "
              "NCCL library");
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return Fail(ncclInvalidUsage,
              "ncclCommWindowDeregister: symmetric memory windows are not supported by railyard's "
              "NCCL library");
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  if (op == nullptr || scalar == nullptr || comm == nullptr) {
    return Fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: op, scalar or comm is NULL");
  }
  railyard::DataType dt;
  std::string why;
  if (ncclResult_t r = railyard::nccl::ToDataType(datatype, &dt, &why); r != ncclSuccess) {
    return Fail(r, absl::StrCat("ncclRedOpCreatePreMulSum: ", why));
  }
  if (residence != ncclScalarHostImmediate && residence != ncclScalarDevice) {
    return Fail(ncclInvalidArgument,
                absl::StrCat("ncclRedOpCreatePreMulSum: residence ", static_cast<int>(residence)));
  }
  int device = -1;
  if (residence == ncclScalarDevice && railyard::nccl::IsDevicePointer(scalar, &device)) {
    return Fail(ncclInvalidUsage,
                "ncclRedOpCreatePreMulSum: a scalar in device memory is not supported by "
                "railyard's NCCL library (pass it in host memory)");
  }
  return comm->s->CreatePreMulSum(op, scalar, datatype, residence);
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (comm == nullptr) return Fail(ncclInvalidArgument, "ncclRedOpDestroy: comm is NULL");
  return comm->s->DestroyPreMulSum(op);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return Coll({"ncclReduce", Kind::kReduce, sendbuff, recvbuff, count, datatype, op, root}, comm,
              stream);
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return Coll({"ncclBcast", Kind::kBroadcast, buff, buff, count, datatype, ncclSum, root}, comm,
              stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return Coll(
      {"ncclBroadcast", Kind::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root}, comm,
      stream);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return Coll({"ncclAllReduce", Kind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0}, comm,
              stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return Coll(
      {"ncclReduceScatter", Kind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0},
      comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return Coll(
      {"ncclAllGather", Kind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0},
      comm, stream);
}

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return Coll({"ncclAlltoAll", Kind::kAllToAll, sendbuff, recvbuff, count, datatype, ncclSum, 0},
              comm, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return Coll({"ncclSend", Kind::kSend, sendbuff, nullptr, count, datatype, ncclSum, peer}, comm,
              stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return Coll({"ncclRecv", Kind::kRecv, nullptr, recvbuff, count, datatype, ncclSum, peer}, comm,
              stream);
}

// Gather and Scatter as NCCL runs them: a group of sends and receives with the root, the root's
// own part copied.
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  CommState* s = S(comm);
  if (s == nullptr) return Fail(ncclInvalidArgument, "ncclGather: comm is NULL");
  if (root < 0 || root >= s->nranks()) {
    return Fail(ncclInvalidArgument,
                absl::StrCat("ncclGather: root ", root, " not in [0, ", s->nranks(), ")"));
  }
  const size_t bytes = count * railyard::nccl::ElementBytes(datatype);
  railyard::nccl::GroupStart();
  ncclResult_t r = ncclSuccess;
  if (s->rank() == root) {
    for (int peer = 0; peer < s->nranks() && r == ncclSuccess; ++peer) {
      char* at = static_cast<char*>(recvbuff) + peer * bytes;
      if (peer == root) {
        if (bytes > 0 && at != sendbuff) {
          r = cudaMemcpyAsync(at, sendbuff, bytes, cudaMemcpyDefault, stream) == cudaSuccess
                  ? ncclSuccess
                  : (std::memmove(at, sendbuff, bytes), ncclSuccess);
        }
        continue;
      }
      r = ncclRecv(at, count, datatype, peer, comm, stream);
    }
  } else {
    r = ncclSend(sendbuff, count, datatype, root, comm, stream);
  }
  const ncclResult_t end = railyard::nccl::GroupEnd();
  return r != ncclSuccess ? r : end;
}

ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  CommState* s = S(comm);
  if (s == nullptr) return Fail(ncclInvalidArgument, "ncclScatter: comm is NULL");
  if (root < 0 || root >= s->nranks()) {
    return Fail(ncclInvalidArgument,
                absl::StrCat("ncclScatter: root ", root, " not in [0, ", s->nranks(), ")"));
  }
  const size_t bytes = count * railyard::nccl::ElementBytes(datatype);
  railyard::nccl::GroupStart();
  ncclResult_t r = ncclSuccess;
  if (s->rank() == root) {
    for (int peer = 0; peer < s->nranks() && r == ncclSuccess; ++peer) {
      const char* from = static_cast<const char*>(sendbuff) + peer * bytes;
      if (peer == root) {
        if (bytes > 0 && from != recvbuff) {
          r = cudaMemcpyAsync(recvbuff, from, bytes, cudaMemcpyDefault, stream) == cudaSuccess
                  ? ncclSuccess
                  : (std::memmove(recvbuff, from, bytes), ncclSuccess);
        }
        continue;
      }
      r = ncclSend(from, count, datatype, peer, comm, stream);
    }
  } else {
    r = ncclRecv(recvbuff, count, datatype, root, comm, stream);
  }
  const ncclResult_t end = railyard::nccl::GroupEnd();
  return r != ncclSuccess ? r : end;
}

ncclResult_t ncclGroupStart() { return railyard::nccl::GroupStart(); }
ncclResult_t ncclGroupEnd() { return railyard::nccl::GroupEnd(); }

ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* sim_info) {
  return Fail(ncclInvalidUsage,
              "ncclGroupSimulateEnd is not supported by railyard's NCCL library (railctl explain "
              "gives the daemon's cost estimate)");
}

// NCCL's profiling names.
#define RAILYARD_PNCCL(ret, name, args) ret p##name args __attribute__((alias(#name)));
RAILYARD_PNCCL(ncclResult_t, ncclGetVersion, (int*))
RAILYARD_PNCCL(ncclResult_t, ncclGetUniqueId, (ncclUniqueId*))
RAILYARD_PNCCL(ncclResult_t, ncclCommInitRankConfig,
               (ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*))
RAILYARD_PNCCL(ncclResult_t, ncclCommInitRank, (ncclComm_t*, int, ncclUniqueId, int))
RAILYARD_PNCCL(ncclResult_t, ncclCommInitRankScalable,
               (ncclComm_t*, int, int, int, ncclUniqueId*, ncclConfig_t*))
RAILYARD_PNCCL(ncclResult_t, ncclCommInitAll, (ncclComm_t*, int, const int*))
RAILYARD_PNCCL(ncclResult_t, ncclCommFinalize, (ncclComm_t))
RAILYARD_PNCCL(ncclResult_t, ncclCommDestroy, (ncclComm_t))
RAILYARD_PNCCL(ncclResult_t, ncclCommAbort, (ncclComm_t))
RAILYARD_PNCCL(ncclResult_t, ncclCommRevoke, (ncclComm_t, int))
RAILYARD_PNCCL(ncclResult_t, ncclCommSplit, (ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*))
RAILYARD_PNCCL(ncclResult_t, ncclCommShrink,
               (ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int))
RAILYARD_PNCCL(const char*, ncclGetErrorString, (ncclResult_t))
RAILYARD_PNCCL(const char*, ncclGetLastError, (ncclComm_t))
RAILYARD_PNCCL(void, ncclResetDebugInit, ())
RAILYARD_PNCCL(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t, ncclResult_t*))
RAILYARD_PNCCL(ncclResult_t, ncclCommCount, (const ncclComm_t, int*))
RAILYARD_PNCCL(ncclResult_t, ncclCommCuDevice, (const ncclComm_t, int*))
RAILYARD_PNCCL(ncclResult_t, ncclCommUserRank, (const ncclComm_t, int*))
RAILYARD_PNCCL(ncclResult_t, ncclMemAlloc, (void**, size_t))
RAILYARD_PNCCL(ncclResult_t, ncclMemFree, (void*))
RAILYARD_PNCCL(ncclResult_t, ncclCommRegister, (const ncclComm_t, void*, size_t, void**))
RAILYARD_PNCCL(ncclResult_t, ncclCommDeregister, (const ncclComm_t, void*))
RAILYARD_PNCCL(ncclResult_t, ncclCommWindowRegister,
               (ncclComm_t, void*, size_t, ncclWindow_t*, int))
RAILYARD_PNCCL(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t, ncclWindow_t))
RAILYARD_PNCCL(ncclResult_t, ncclRedOpCreatePreMulSum,
               (ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t))
RAILYARD_PNCCL(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t, ncclComm_t))
RAILYARD_PNCCL(ncclResult_t, ncclReduce,
               (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                cudaStream_t))
RAILYARD_PNCCL(ncclResult_t, ncclBcast,
               (void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
RAILYARD_PNCCL(ncclResult_t, ncclBroadcast,
               (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
RAILYARD_PNCCL(ncclResult_t, ncclAllReduce,
               (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))
RAILYARD_PNCCL(ncclResult_t, ncclReduceScatter,
               (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))
RAILYARD_PNCCL(ncclResult_t, ncclAllGather,
               (const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t))
RAILYARD_PNCCL(ncclResult_t, ncclAlltoAll,
               (const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t))
RAILYARD_PNCCL(ncclResult_t, ncclGather,
               (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
RAILYARD_PNCCL(ncclResult_t, ncclScatter,
               (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
RAILYARD_PNCCL(ncclResult_t, ncclSend,
               (const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
RAILYARD_PNCCL(ncclResult_t, ncclRecv,
               (void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
RAILYARD_PNCCL(ncclResult_t, ncclGroupStart, ())
RAILYARD_PNCCL(ncclResult_t, ncclGroupEnd, ())
RAILYARD_PNCCL(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t*))
#undef RAILYARD_PNCCL

}  // extern "C"
