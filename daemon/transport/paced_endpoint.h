// An endpoint whose sends wait their turn in a rail's FairQueue (fair_queue.h): the daemon puts
// one around each communicator's endpoint on a paced rail, so every job's sends on that rail go
// out at the rail's rate in weighted fair order. Receives, and Abort, go straight through; Abort
// also releases the communicator's queued sends at once (they fail in the inner endpoint rather
// than wait for their turn).
#pragma once

#include <memory>
#include <string>

#include "daemon/transport/fair_queue.h"
#include "daemon/transport/transport.h"

namespace railyard::transport {

class PacedEndpoint : public Endpoint {
 public:
  PacedEndpoint(std::shared_ptr<Endpoint> inner, std::shared_ptr<FairQueue> queue, std::string job,
                std::string comm);
  ~PacedEndpoint() override;

  void SendV(Tag tag, const Segment* segments, int count, CompletionFn done) override;
  void RecvV(Tag tag, const Segment* segments, int count, RecvCompletionFn done) override;
  void Abort(const absl::Status& status) override;

 private:
  const std::shared_ptr<Endpoint> inner_;
  const std::shared_ptr<FairQueue> queue_;
  const std::string job_;
  const std::string comm_;
};

}  // namespace railyard::transport
