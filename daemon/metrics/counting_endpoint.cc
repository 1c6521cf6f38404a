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

void CountingEndpoint::Send(transport::Tag tag, const void* data, size_t size,
                            transport::CompletionFn done) {
  inner_->Send(tag, data, size,
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

void CountingEndpoint::Recv(transport::Tag tag, void* data, size_t size,
                            transport::CompletionFn done) {
  inner_->Recv(tag, data, size,
               [link = link_, job = job_bytes_, size, done = std::move(done)](absl::Status s) {
                 if (s.ok()) {
                   link->rx_bytes->Increment(static_cast<double>(size));
                   link->rx_messages->Increment();
                   if (job != nullptr) job->Increment(static_cast<double>(size));
                 } else {
                   link->rx_errors->Increment();
                 }
                 done(std::move(s));
               });
}

}  // namespace railyard::metrics
