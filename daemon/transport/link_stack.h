// The endpoint stack of one link from this daemon to another (one peer node, one rail): what a
// multi-node communicator sends and receives through. Built per communicator and link by
// LinkStack::Build, bottom to top:
//   wire     the transport's endpoint to the peer's rail (Transport::Connect)
//   faults   test builds only: the wire layer railyardd-testing installs (bit flips under the
//            frame, --test_flip_bit_every); the installed railyardd has none
//   framing  FramedEndpoint: the communicator's secret, and CRC-32C under --integrity=crc32c
//   observe  what the caller wraps around the framed endpoint (the daemon counts into its link
//            metrics there, metrics::CountingEndpoint)
//   pacing   PacedEndpoint through the rail's FairQueue, on a paced rail only
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "daemon/transport/fair_queue.h"
#include "daemon/transport/framed_endpoint.h"
#include "daemon/transport/transport.h"

namespace railyard::transport {

class LinkStack {
 public:
  // Wraps an endpoint in a layer.
  using Layer = std::function<std::shared_ptr<Endpoint>(std::shared_ptr<Endpoint>)>;
  // Wraps the wire endpoint of a link on `rail` (fault injection in test builds).
  using WireLayer = std::function<std::shared_ptr<Endpoint>(std::shared_ptr<Endpoint>, int rail)>;

  struct Link {
    std::shared_ptr<Endpoint> wire;  // non-null
    int rail = 0;
    FramedEndpoint::Options frame;
    Layer observe;                    // null: nothing between framing and pacing
    std::shared_ptr<FairQueue> pace;  // null: an unpaced rail
    std::string job;                  // the pacing's flow
    std::string comm_id;              // and its communicator within the job
  };

  // wire_layer: null (the installed daemon) leaves the wire as the transport made it.
  explicit LinkStack(WireLayer wire_layer = nullptr) : wire_layer_(std::move(wire_layer)) {}

  std::shared_ptr<Endpoint> Build(Link link) const;

 private:
  const WireLayer wire_layer_;
};

}  // namespace railyard::transport
