// A transport endpoint that counts what passes through it into a link's metrics: the seam
// between the transport (which never knows about metrics) and the registry. Wraps any
// transport::Endpoint; counting is a few relaxed atomic adds per message.
#pragma once

#include <memory>

#include "daemon/metrics/daemon_metrics.h"
#include "daemon/transport/transport.h"

namespace railyard::metrics {

class CountingEndpoint : public transport::Endpoint {
 public:
  // link: the (node, peer, rail) counters; job_bytes: the job's fabric bytes (may be null; held,
  // which keeps the job's series exported while this endpoint lives); endpoints: the gauge of
  // endpoints in use (may be null), incremented for this one's life.
  CountingEndpoint(std::shared_ptr<transport::Endpoint> inner, const LinkCounters* link,
                   std::shared_ptr<Counter> job_bytes, Gauge* endpoints);
  ~CountingEndpoint() override;

  // Bytes and messages count when the transport reports success; errors when it does not.
  void SendV(transport::Tag tag, const transport::Segment* segments, int count,
             transport::CompletionFn done) override;
  void RecvV(transport::Tag tag, const transport::Segment* segments, int count,
             transport::RecvCompletionFn done) override;
  void Abort(const absl::Status& status) override { inner_->Abort(status); }

 private:
  const std::shared_ptr<transport::Endpoint> inner_;
  const LinkCounters* const link_;
  const std::shared_ptr<Counter> job_bytes_;
  Gauge* const endpoints_;
};

}  // namespace railyard::metrics
