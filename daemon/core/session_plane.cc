#include "daemon/core/session_plane.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/session/quota.h"
#include "daemon/session/session_rings.h"
#include "daemon/session/shm_segment.h"
#include "daemon/util/log.h"
#include "proto/railyard/v1/ring.h"

namespace railyard {

SessionPlane::SessionPlane(const DaemonConfig& config, Deps deps)
    : config_(config), deps_(deps), mappings_(config.max_mappings, config.max_mappings_per_job) {}

void SessionPlane::SetDevices(device::DeviceRuntime* devices, absl::Status why_none) {
  devices_ = devices;
  no_devices_ = std::move(why_none);
}

absl::StatusOr<std::shared_ptr<Session>> SessionPlane::Open(const v1::ConnectRequest& req) {
  if (req.fd_ticket().empty()) {
    return absl::InvalidArgumentError(
        "Connect needs fd_ticket: connect the buffer side channel <socket>.fd first and pass the "
        "ticket it sends (clients from before buffer descriptors do not)");
  }
  if (fd_channels_ == nullptr) return absl::UnavailableError("the fd side channel is not serving");
  absl::StatusOr<std::shared_ptr<FdChannel>> channel = fd_channels_->Claim(req.fd_ticket());
  if (!channel.ok()) return channel.status();
  const PeerCred cred = (*channel)->cred();
  absl::StatusOr<std::shared_ptr<Session>> session =
      deps_.sessions->Open(req.job_id(), req.token(), cred, req.client());
  if (!session.ok()) {
    (*channel)->Close();
    Log(LogLevel::kWarning, "session", "connect refused",
        {F("job", req.job_id().substr(0, 64)), F("pid", cred.pid), F("uid", cred.uid),
         F("gid", cred.gid), F("reason", session.status().message())});
    return session.status();
  }
  (*session)->AttachFdChannel(*std::move(channel), req.pid());
  if (deps_.metrics != nullptr) deps_.metrics->AddJob((*session)->job());
  Log(LogLevel::kInfo, "session", "connected",
      {F("session", (*session)->id().substr(0, 8)), F("job", (*session)->job()), F("pid", cred.pid),
       F("uid", cred.uid), F("gid", cred.gid), F("reported_pid", req.pid())});
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionPlane::Find(const std::string& session_id) {
  return deps_.sessions->Find(session_id);
}

void SessionPlane::Close(const std::shared_ptr<Session>& session, const std::string& why,
                         const grpc::Status& stream_status) {
  if (!deps_.sessions->Remove(session)) return;
  session->Close(stream_status);
  deps_.submit->DropHeld(*session, absl::CancelledError("the session has ended"));
  if (std::shared_ptr<SessionRings> rings = session->rings()) rings->Stop();
  if (std::shared_ptr<FdChannel> channel = session->fd_channel()) channel->Close();
  const auto buffers = session->TakeBuffers();  // unmapped when the last operation lets go
  for (auto& [handle, m] : session->TakeMemberships()) {
    m.comm->Leave(m.rank, absl::UnavailableError(absl::StrCat("rank ", m.rank, " of communicator ",
                                                              m.comm->comm_id(), " (pid ",
                                                              session->pid(), ") left: ", why)));
    RetireCommIfEmpty(m.comm);
  }
  Log(LogLevel::kInfo, "session", "closed",
      {F("session", session->id().substr(0, 8)), F("job", session->job()), F("pid", session->pid()),
       F("reason", why), F("buffers_released", buffers.size())});
}

absl::StatusOr<uint64_t> SessionPlane::RegisterBuffer(Session& session, uint64_t fd_handle,
                                                      uint64_t size, v1::MemoryKind memory,
                                                      int device, std::string_view cuda_ipc_handle,
                                                      uint64_t cuda_ipc_offset) {
  const bool ipc = !cuda_ipc_handle.empty();
  absl::StatusOr<UniqueFd> fd = UniqueFd();
  if (ipc) {
    if (fd_handle != 0) {
      return absl::InvalidArgumentError(
          "a buffer comes either as a descriptor (fd_handle) or as a CUDA IPC handle, not both");
    }
    if (memory != v1::MEMORY_KIND_CUDA) {
      return absl::InvalidArgumentError(
          "a CUDA IPC handle names device memory: memory must be "
          "MEMORY_KIND_CUDA");
    }
    if (!config_.cuda_ipc) {
      return absl::FailedPreconditionError(
          "this daemon does not take legacy CUDA IPC handles (--cuda_ipc is off: such a handle "
          "is not bound to the process that made it, so the daemon could not tell whether this "
          "session's process owns the memory): register a VMM allocation exported as a file "
          "descriptor (Client::AllocateDevice, or cuMemCreate with "
          "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), or ask the operator for --cuda_ipc");
    }
  } else {
    std::shared_ptr<FdChannel> channel = session.fd_channel();
    if (channel == nullptr) {
      return absl::FailedPreconditionError("this session has no buffer side channel");
    }
    fd = channel->Take(fd_handle);
    if (!fd.ok()) return fd.status();
  }
  if (size == 0) return absl::InvalidArgumentError("buffer size must be > 0");
  if (memory != v1::MEMORY_KIND_HOST && memory != v1::MEMORY_KIND_CUDA) {
    return absl::InvalidArgumentError(absl::StrCat("memory kind ", static_cast<int>(memory),
                                                   " is not one this daemon knows (host, cuda)"));
  }
  if (memory == v1::MEMORY_KIND_CUDA) {
    if (devices_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("this daemon serves no device memory: ", no_devices_.message()));
    }
    if (devices_->DeviceCount() == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("this daemon serves no device memory: ", devices_->Describe()));
    }
  }
  QuotaCharge count;
  QuotaCharge bytes;
  if (absl::Status s = QuotaCharge::Take(session.quota(), Resource::kBuffers, 1, &count); !s.ok()) {
    return s;
  }
  if (absl::Status s = QuotaCharge::Take(session.quota(), Resource::kBufferBytes, size, &bytes);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::shared_ptr<MappedSegment>> seg;
  std::shared_ptr<void> mapping;  // host memory's place in the mapping budget
  if (memory == v1::MEMORY_KIND_CUDA) {
    absl::StatusOr<std::shared_ptr<device::DeviceMapping>> mapping =
        ipc ? devices_->ImportIpc(device, cuda_ipc_handle, cuda_ipc_offset, size,
                                  session.cred().pid)
            : devices_->Import(device, *std::move(fd), size);
    if (mapping.ok()) {
      seg = MappedSegment::FromDevice(*std::move(mapping));
    } else {
      seg = mapping.status();
    }
  } else {
    absl::StatusOr<std::shared_ptr<void>> taken = mappings_.Take(session.job());
    if (!taken.ok()) return taken.status();
    mapping = *std::move(taken);
    seg = MappedSegment::MapMemfd(*std::move(fd), size);
  }
  if (!seg.ok()) {
    Log(LogLevel::kWarning, "session", "buffer refused",
        {F("session", session.id().substr(0, 8)), F("job", session.job()), F("pid", session.pid()),
         F("reason", seg.status().message())});
    return seg.status();
  }
  (*seg)->HoldCharges(std::move(count), std::move(bytes));
  (*seg)->HoldMapping(std::move(mapping));
  const uint64_t id = next_buffer_id_.fetch_add(1);
  if (absl::Status s = session.AddBuffer(id, *std::move(seg)); !s.ok()) return s;
  return id;
}

absl::StatusOr<uint64_t> SessionPlane::RegisterPart(Session& session, uint64_t parent_id,
                                                    uint64_t offset, uint64_t size) {
  std::shared_ptr<MappedSegment> parent = session.FindBuffer(parent_id);
  if (parent == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("parent buffer ", parent_id, " is not registered in this session"));
  }
  QuotaCharge count;
  if (absl::Status s = QuotaCharge::Take(session.quota(), Resource::kBuffers, 1, &count); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::shared_ptr<MappedSegment>> part =
      MappedSegment::PartOf(std::move(parent), offset, size);
  if (!part.ok()) {
    return absl::Status(part.status().code(),
                        absl::StrCat("parent buffer ", parent_id, ": ", part.status().message()));
  }
  (*part)->HoldCharges(std::move(count), QuotaCharge());
  const uint64_t id = next_buffer_id_.fetch_add(1);
  if (absl::Status s = session.AddBuffer(id, *std::move(part)); !s.ok()) return s;
  return id;
}

absl::Status SessionPlane::ReleaseBuffer(Session& session, uint64_t buffer_id) {
  if (!session.RemoveBuffer(buffer_id)) {
    return absl::NotFoundError(
        absl::StrCat("buffer ", buffer_id, " is not registered in this session"));
  }
  return absl::OkStatus();
}

absl::Status SessionPlane::OpenRings(const std::shared_ptr<Session>& session, uint64_t fd_handle,
                                     uint32_t sq_entries, uint32_t cq_entries) {
  std::shared_ptr<FdChannel> channel = session->fd_channel();
  if (channel == nullptr) {
    return absl::FailedPreconditionError("this session has no buffer side channel");
  }
  absl::StatusOr<UniqueFd> fd = channel->Take(fd_handle);
  if (!fd.ok()) return fd.status();
  if (session->rings() != nullptr) {
    return absl::AlreadyExistsError("this session's rings are open already (one per session)");
  }
  if (!ringproto::ValidEntries(sq_entries) || !ringproto::ValidEntries(cq_entries)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring entries must be powers of two in [", ringproto::kMinEntries, ", ",
        ringproto::kMaxEntries, "], not sq_entries ", sq_entries, " cq_entries ", cq_entries));
  }
  absl::StatusOr<std::shared_ptr<void>> mapping = mappings_.Take(session->job());
  if (!mapping.ok()) {
    return absl::Status(mapping.status().code(),
                        absl::StrCat("rings refused: ", mapping.status().message()));
  }
  absl::StatusOr<std::shared_ptr<MappedSegment>> seg =
      MappedSegment::MapMemfd(*std::move(fd), ringproto::RingBytes(sq_entries, cq_entries));
  if (!seg.ok()) {
    return absl::Status(seg.status().code(),
                        absl::StrCat("rings memfd refused: ", seg.status().message()));
  }
  (*seg)->HoldMapping(*std::move(mapping));
  absl::StatusOr<std::shared_ptr<SessionRings>> rings =
      SessionRings::Create(*std::move(seg), sq_entries, cq_entries, config_.spin, config_.poll);
  if (!rings.ok()) return rings.status();
  if (absl::Status s = session->AttachRings(*rings); !s.ok()) return s;
  std::weak_ptr<Session> weak = session;
  (*rings)->Start(
      [this, weak](const std::vector<RingSubmission>& entries,
                   const std::shared_ptr<CompletionSink>& sink) {
        std::shared_ptr<Session> s = weak.lock();
        if (s == nullptr || s->closed()) {
          return std::vector<absl::StatusOr<uint64_t>>(
              entries.size(), absl::CancelledError("the session has ended"));
        }
        std::vector<const v1::SubmitRequest*> reqs;
        reqs.reserve(entries.size());
        for (const RingSubmission& e : entries) reqs.push_back(&e.request);
        return deps_.submit->SubmitBatch(s, reqs, sink);
      },
      *deps_.ring_pollers, session->job(), transport_);
  Log(LogLevel::kInfo, "session", "rings open",
      {F("session", session->id().substr(0, 8)), F("job", session->job()),
       F("sq_entries", sq_entries), F("cq_entries", cq_entries)});
  return absl::OkStatus();
}

absl::Status SessionPlane::DestroyComm(Session& session, uint64_t handle) {
  absl::StatusOr<Membership> m = session.FindMembership(handle);
  if (!m.ok()) return m.status();
  session.RemoveMembership(handle);
  // What the rank still had waiting for its stream on this communicator goes with it.
  deps_.submit->DropHeld(session, handle,
                         absl::CancelledError(absl::StrCat(
                             "rank ", m->rank, " destroyed communicator ", m->comm->comm_id())));
  m->comm->Leave(m->rank,
                 absl::AbortedError(absl::StrCat("rank ", m->rank, " destroyed communicator ",
                                                 m->comm->comm_id())),
                 /*graceful=*/true);
  RetireCommIfEmpty(m->comm);
  return absl::OkStatus();
}

void SessionPlane::RetireCommIfEmpty(const std::shared_ptr<Communicator>& comm) {
  if (comm->all_left()) deps_.comms->Retire(comm);
}

}  // namespace railyard
