// A Transport that runs in one process, for unit tests of the executor and scheduler: transports
// created on one InProcFabric reach each other by address, a Send and a Recv match by (receiving
// transport, rail, tag) and the bytes move with memcpy. Completions run on the fabric's thread,
// never inside Send/Recv, so callers see the same asynchrony as over UCX.
//
// Semantics worth knowing when writing tests against it:
// - Rendezvous only: a Send completes when a matching Recv exists and the copy is done (UCX
//   completes small sends eagerly). A schedule that works here does not rely on send buffering.
// - As with UCX, a Recv matches any sender's message with its tag; it is tracked on the endpoint
//   it was posted on, so that Abort of that endpoint or the death of its peer fails it.
// - A message whose size differs from the receive's fails the Recv (INTERNAL); the Send
//   completes OK. RecvV reports a shorter message's length and fails a longer one with
//   OUT_OF_RANGE, as over UCX.
// - InProcFabric::Kill(address) rehearses a peer daemon dying: every pending and later operation
//   to or from that transport fails with UNAVAILABLE naming it.
// - Abort is local: the peer's own endpoint is not told (over UCX it may be, the connection
//   closes); do not rely on either.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/transport/transport.h"

namespace railyard::transport {

class InProcTransport;

// The shared "network": the address registry, the matching queues and the thread that copies
// bytes and runs completions. Transports and endpoints keep it alive.
class InProcFabric : public std::enable_shared_from_this<InProcFabric> {
 public:
  static std::shared_ptr<InProcFabric> Create();
  ~InProcFabric();  // runs the completions still queued, then joins the fabric thread
  InProcFabric(const InProcFabric&) = delete;
  InProcFabric& operator=(const InProcFabric&) = delete;

  // A transport with num_rails rails, whose addresses are "inproc://<name>/<rail>". Errors:
  // INVALID_ARGUMENT for num_rails < 1 or a name with '/' or empty; ALREADY_EXISTS when a live
  // transport on this fabric has that name.
  absl::StatusOr<std::unique_ptr<InProcTransport>> NewTransport(const std::string& name,
                                                                int num_rails);

  // Kills the transport that address (any of its LocalAddress()es, or its name) belongs to, as
  // if its process had died. Errors: NOT_FOUND when no transport has that name.
  absl::Status Kill(const std::string& address);

 private:
  friend class InProcTransport;
  friend class InProcEndpoint;
  struct Node;
  struct EndpointState;
  struct Op;
  struct WorkQueue;  // shared with the fabric thread, which may outlive the fabric by a moment
  struct RailQueues {
    std::map<Tag, std::deque<Op*>> recvs;  // posted, unmatched
    std::map<Tag, std::deque<Op*>> sends;  // unexpected: sent before their Recv was posted
  };

  InProcFabric();
  // Queues fn for the fabric thread. Called with mu_ held, so that completions keep their order.
  void Defer(std::function<void()> fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Why operations on ep fail, or OK.
  absl::Status EndpointStatus(const EndpointState& ep) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Post(Op* op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Transfer(Op* send, Op* recv) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes op from its endpoint and queues done(status).
  void Finish(Op* op, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailEndpoint(EndpointState* ep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailNode(Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Called by InProcTransport / InProcEndpoint.
  absl::StatusOr<std::shared_ptr<EndpointState>> Connect(const std::shared_ptr<Node>& local,
                                                         int rail, const std::string& address);
  void Start(const std::shared_ptr<EndpointState>& ep, bool is_send, Tag tag,
             const Segment* segments, int count, RecvCompletionFn done);
  void Abort(EndpointState* ep, absl::Status status);
  void Release(EndpointState* ep);
  void Shutdown(Node* node);

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
  std::unordered_set<EndpointState*> endpoints_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<WorkQueue> queue_;
  std::thread thread_;
};

class InProcTransport : public Transport {
 public:
  ~InProcTransport() override;  // Shutdown()

  int num_rails() const override { return num_rails_; }
  // "inproc://<name>/<rail>"; INVALID_ARGUMENT for a rail out of range.
  absl::StatusOr<std::string> LocalAddress(int rail) override;
  // INVALID_ARGUMENT for a rail out of range or an address that is not "inproc://<name>/<rail>"
  // or names a rail the peer lacks; UNAVAILABLE when no transport on the fabric has that name;
  // FAILED_PRECONDITION after Shutdown. Destroying the endpoint cancels its pending operations.
  absl::StatusOr<std::shared_ptr<Endpoint>> Connect(const std::string& peer_address,
                                                    int rail) override;
  // Pending and later operations of this transport fail with CANCELLED; peers' operations to it
  // with UNAVAILABLE. Idempotent.
  void Shutdown() override;

  const std::string& name() const;

 private:
  friend class InProcFabric;
  InProcTransport(std::shared_ptr<InProcFabric> fabric, std::shared_ptr<InProcFabric::Node> node,
                  int num_rails);

  const std::shared_ptr<InProcFabric> fabric_;
  const std::shared_ptr<InProcFabric::Node> node_;
  const int num_rails_;
};

}  // namespace railyard::transport
