#include "daemon/transport/link_stack.h"

#include <utility>

#include "daemon/transport/paced_endpoint.h"

namespace railyard::transport {

std::shared_ptr<Endpoint> LinkStack::Build(Link link) const {
  std::shared_ptr<Endpoint> ep = std::move(link.wire);
  if (wire_layer_ != nullptr) ep = wire_layer_(std::move(ep), link.rail);
  ep = std::make_shared<FramedEndpoint>(std::move(ep), std::move(link.frame));
  if (link.observe != nullptr) ep = link.observe(std::move(ep));
  if (link.pace != nullptr) {
    ep = std::make_shared<PacedEndpoint>(std::move(ep), std::move(link.pace), std::move(link.job),
                                         std::move(link.comm_id));
  }
  return ep;
}

}  // namespace railyard::transport
