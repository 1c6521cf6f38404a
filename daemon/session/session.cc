#include "daemon/session/session.h"

#include "absl/time/clock.h"

namespace railyard {

// Locking: decisions are made under mu_, but StartWrite/Finish run after it is released, because
// gRPC may run OnDone (which deletes this) on another thread as soon as Finish is called.

void SessionStream::Send(v1::SessionEvent event, std::shared_ptr<QuotaAccount> backlog) {
  v1::SessionEvent* to_write = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (closing_ || finished_) return;
    const uint64_t bytes = event.ByteSizeLong();
    queue_.push_back(
        {std::move(event),
         QuotaCharge::TakePastLimit(std::move(backlog), Resource::kCompletionBytes, bytes)});
    if (writing_) return;
    writing_ = true;
    to_write = &queue_.front().event;  // deque references survive push_back
  }
  StartWrite(to_write);
}

void SessionStream::Close(const grpc::Status& status) {
  grpc::Status finish;
  {
    absl::MutexLock lock(&mu_);
    if (closing_ || finished_) return;
    closing_ = true;
    close_status_ = status;
    if (writing_) return;  // OnWriteDone finishes once the queue is drained
    finished_ = true;
    finish = close_status_;
  }
  Finish(finish);
}

void SessionStream::OnWriteDone(bool ok) {
  v1::SessionEvent* to_write = nullptr;
  grpc::Status finish;
  {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();  // written (or not: the client is gone): its backlog is released
    if (ok && !queue_.empty()) {
      to_write = &queue_.front().event;
    } else {
      writing_ = false;
      if (!ok) {
        // The client is gone; OnCancel follows. Drop what is queued.
        queue_.clear();
        closing_ = true;
        close_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "client stream broken");
      }
      if (!closing_ || finished_) return;
      finished_ = true;
      finish = close_status_;
    }
  }
  if (to_write != nullptr) {
    StartWrite(to_write);
  } else {
    Finish(finish);
  }
}

void SessionStream::OnCancel() {
  bool finish = false;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    close_status_ = grpc::Status::CANCELLED;
    if (!finished_ && !writing_) finish = finished_ = true;
  }
  // Tell the owner first: Finish may let OnDone delete this at once.
  if (on_cancel_) on_cancel_();
  if (finish) Finish(grpc::Status::CANCELLED);
}

void SessionStream::OnDone() {
  if (on_done_) on_done_();
  delete this;
}

Session::Session(std::string id, std::string job, int64_t pid, std::string client,
                 std::shared_ptr<QuotaAccount> quota, PeerCred cred)
    : id_(std::move(id)),
      job_(std::move(job)),
      pid_(pid),
      client_(std::move(client)),
      connected_at_(absl::Now()),
      quota_(std::move(quota)),
      cred_(cred) {}

void Session::AttachStream(SessionStream* stream) {
  absl::MutexLock lock(&mu_);
  stream_ = stream;
}

void Session::DetachStream() {
  absl::MutexLock lock(&mu_);
  stream_ = nullptr;
}

v1::SessionEvent CompletionEvent(uint64_t request_id, const absl::Status& status, uint64_t seq) {
  v1::SessionEvent event;
  auto* c = event.mutable_completion();
  c->set_request_id(request_id);
  c->set_code(static_cast<int32_t>(status.code()));
  c->set_message(std::string(status.message()));
  c->set_seq(seq);
  if (IsMoved(status)) c->set_flags(v1::COMPLETION_MOVED);
  return event;
}

void Session::PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) {
  v1::SessionEvent event = CompletionEvent(request_id, status, seq);
  absl::MutexLock lock(&mu_);
  if (stream_ != nullptr) stream_->Send(std::move(event), quota_);
}

void Session::Close(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  if (stream_ != nullptr) stream_->Close(status);
}

void Session::SendMoving(const std::string& why, const std::string& daemon_version) {
  v1::SessionEvent event;
  event.mutable_moving()->set_reason(why);
  event.mutable_moving()->set_daemon_version(daemon_version);
  absl::MutexLock lock(&mu_);
  if (stream_ != nullptr) stream_->Send(std::move(event));
}

bool Session::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

absl::Status Session::AddBuffer(uint64_t id, std::shared_ptr<MappedSegment> segment) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::FailedPreconditionError("session is closed");
  buffers_.emplace(id, std::move(segment));
  return absl::OkStatus();
}

std::shared_ptr<MappedSegment> Session::FindBuffer(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(id);
  return it == buffers_.end() ? nullptr : it->second;
}

bool Session::RemoveBuffer(uint64_t id) {
  absl::MutexLock lock(&mu_);
  return buffers_.erase(id) > 0;
}

std::map<uint64_t, std::shared_ptr<MappedSegment>> Session::TakeBuffers() {
  absl::MutexLock lock(&mu_);
  return std::exchange(buffers_, {});
}

uint32_t Session::buffer_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(buffers_.size());
}

uint64_t Session::buffer_bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [id, seg] : buffers_) total += seg->size();
  return total;
}

void Session::AttachFdChannel(std::shared_ptr<FdChannel> channel, int64_t reported_pid) {
  absl::MutexLock lock(&mu_);
  fd_channel_ = std::move(channel);
  reported_pid_ = reported_pid;
}

std::shared_ptr<FdChannel> Session::fd_channel() const {
  absl::MutexLock lock(&mu_);
  return fd_channel_;
}

absl::Status Session::AttachRings(std::shared_ptr<SessionRings> rings) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::FailedPreconditionError("the session has ended");
  if (rings_ != nullptr) {
    return absl::AlreadyExistsError("this session's rings are open already (one per session)");
  }
  rings_ = std::move(rings);
  return absl::OkStatus();
}

std::shared_ptr<SessionRings> Session::rings() const {
  absl::MutexLock lock(&mu_);
  return rings_;
}

int64_t Session::reported_pid() const {
  absl::MutexLock lock(&mu_);
  return reported_pid_;
}

absl::Status Session::AddMembership(uint64_t handle, Membership m) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::FailedPreconditionError("session is closed");
  if (quota_ != nullptr) {
    if (absl::Status s = quota_->Charge(Resource::kComms, 1); !s.ok()) return s;
  }
  if (!memberships_.emplace(handle, std::move(m)).second && quota_ != nullptr) {
    quota_->Release(Resource::kComms, 1);
  }
  return absl::OkStatus();
}

absl::StatusOr<Membership> Session::FindMembership(uint64_t handle) const {
  absl::MutexLock lock(&mu_);
  auto it = memberships_.find(handle);
  if (it == memberships_.end()) {
    return absl::NotFoundError(
        absl::StrCat("comm handle ", handle, " is not a communicator of this session"));
  }
  return it->second;
}

bool Session::RemoveMembership(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  const bool removed = memberships_.erase(handle) > 0;
  if (removed && quota_ != nullptr) quota_->Release(Resource::kComms, 1);
  return removed;
}

std::map<uint64_t, Membership> Session::Memberships() const {
  absl::MutexLock lock(&mu_);
  return memberships_;
}

std::map<uint64_t, Membership> Session::TakeMemberships() {
  absl::MutexLock lock(&mu_);
  if (quota_ != nullptr) quota_->Release(Resource::kComms, memberships_.size());
  return std::exchange(memberships_, {});
}

}  // namespace railyard
