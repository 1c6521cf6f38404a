#include "daemon/metrics/counting_endpoint.h"

namespace railyard::metrics {

CountingEndpoint::CountingEndpoint(std::shared_ptr<transport::Endpoint> inner,
                                   const LinkCounters* link, std::shared_ptr<Counter> job_bytes,
                                   Gauge* endpoints)
    : inner_(std::move(inner)),
      link_(link),
      job_bytes_(std::move(job_bytes)),
      endpoints_(endpoints) {
  if (endpoints_ != nullptr) endpoints_->Increment();
}

CountingEndpoint::~CountingEndpoint() {
  if (endpoints_ != nullptr) endpoints_->Decrement();
}

void CountingEndpoint::SendV(transport::Tag tag, const transport::Segment* segments, int count,
                             transport::CompletionFn done) {
  const size_t size = transport::TotalSize(segments, count);
  inner_->SendV(tag, segments, count,
                [link = link_, job = job_bytes_, size, done = std::move(done)](absl::Status s) {
                  if (s.ok()) {
                    link->tx_bytes->Increment(static_cast<double>(size));
                    link->tx_messages->Increment();
                    if (job != nullptr) job->Increment(static_cast<double>(size));
                  } else {
                    link->tx_errors->Increment();
                  }
                  done(std::move(s));
                });
}

void CountingEndpoint::RecvV(transport::Tag tag, const transport::Segment* segments, int count,
                             transport::RecvCompletionFn done) {
  inner_->RecvV(
      tag, segments, count,
      [link = link_, job = job_bytes_, done = std::move(done)](absl::Status s, size_t length) {
        if (s.ok()) {
          link->rx_bytes->Increment(static_cast<double>(length));
          link->rx_messages->Increment();
          // Read first: the line stays shared while the link is up, as it almost always is.
          if (link->up != nullptr && link->up->Value() != 1.0) link->up->Set(1.0);
          if (job != nullptr) job->Increment(static_cast<double>(length));
        } else {
          link->rx_errors->Increment();
        }
        done(std::move(s), length);
      });
}

}  // namespace railyard::metrics
