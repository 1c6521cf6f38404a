// "Daemons" in one process for unit tests (two unless told): an in-process fabric with one
// 1-rail transport per node ("node0", "node1", ...), and endpoints from one node to the others. The
// fabric can kill a node (fabric().Kill("node1")) to stand in for a dead peer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "daemon/scheduler/node_executor.h"
#include "daemon/transport/inproc/inproc_transport.h"
#include "gtest/gtest.h"

namespace railyard::testing {

class InProcNodes {
 public:
  explicit InProcNodes(int nodes = 2) : transports_(static_cast<size_t>(nodes)) {
    for (int n = 0; n < nodes; ++n) {
      auto t = fabric_->NewTransport("node" + std::to_string(n), 1);
      EXPECT_TRUE(t.ok()) << t.status();
      if (t.ok()) transports_[n] = *std::move(t);
    }
  }

  // A new endpoint from node `from` to node `to` on rail 0 (null, with a test failure, when the
  // transport refuses).
  std::shared_ptr<transport::Endpoint> Connect(int from, int to) {
    auto addr = transports_[to]->LocalAddress(0);
    EXPECT_TRUE(addr.ok()) << addr.status();
    if (!addr.ok()) return nullptr;
    auto ep = transports_[from]->Connect(*addr, 0);
    EXPECT_TRUE(ep.ok()) << ep.status();
    return ep.ok() ? *std::move(ep) : nullptr;
  }

  // endpoints[node][rail] as node `me` holds them: one to each other node, none to itself.
  scheduler::EndpointTable EndpointsOf(int me) {
    scheduler::EndpointTable table(transports_.size());
    for (int n = 0; n < static_cast<int>(transports_.size()); ++n) {
      if (n != me) table[n] = {Connect(me, n)};
    }
    return table;
  }

  transport::InProcFabric& fabric() { return *fabric_; }

 private:
  std::shared_ptr<transport::InProcFabric> fabric_ = transport::InProcFabric::Create();
  std::vector<std::unique_ptr<transport::InProcTransport>> transports_;
};

}  // namespace railyard::testing
