#include "daemon/transport/paced_endpoint.h"

#include <array>
#include <utility>

namespace railyard::transport {

PacedEndpoint::PacedEndpoint(std::shared_ptr<Endpoint> inner, std::shared_ptr<FairQueue> queue,
                             std::string job, std::string comm)
    : inner_(std::move(inner)),
      queue_(std::move(queue)),
      job_(std::move(job)),
      comm_(std::move(comm)) {}

// A send still queued holds the inner endpoint (its closure owns a reference), so it is issued,
// and completes, even after the communicator dropped this wrapper.
PacedEndpoint::~PacedEndpoint() = default;

void PacedEndpoint::SendV(Tag tag, const Segment* segments, int count, CompletionFn done) {
  if (count < 1 || count > kMaxSegments) {
    inner_->SendV(tag, segments, count, std::move(done));  // it reports the error
    return;
  }
  std::array<Segment, kMaxSegments> copy{};
  for (int i = 0; i < count; ++i) copy[i] = segments[i];
  const size_t bytes = TotalSize(segments, count);
  queue_->Submit(job_, comm_, bytes,
                 [inner = inner_, tag, copy, count, done = std::move(done)]() mutable {
                   inner->SendV(tag, copy.data(), count, std::move(done));
                 });
}

void PacedEndpoint::RecvV(Tag tag, const Segment* segments, int count, RecvCompletionFn done) {
  inner_->RecvV(tag, segments, count, std::move(done));
}

void PacedEndpoint::Abort(const absl::Status& status) {
  inner_->Abort(status);
  queue_->Flush(job_, comm_);
}

}  // namespace railyard::transport
