#include "daemon/transport/inproc/inproc_transport.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace railyard::transport {

struct InProcFabric::WorkQueue {
  absl::Mutex mu;
  std::deque<std::function<void()>> work ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;

  // Runs queued work until stopping and empty. Uses only *this, which the thread co-owns: a
  // completion may drop the last reference to the fabric, destroying it on this thread.
  void Loop() {
    absl::MutexLock lock(&mu);
    while (true) {
      mu.Await(absl::Condition(
          +[](WorkQueue* q)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return q->stopping || !q->work.empty(); },
          this));
      if (work.empty()) return;
      std::function<void()> fn = std::move(work.front());
      work.pop_front();
      mu.Unlock();
      fn();
      fn = nullptr;  // destroy captures outside the lock too
      mu.Lock();
    }
  }
};

// One transport (a "daemon").
struct InProcFabric::Node {
  std::string name;
  int num_rails = 0;
  std::vector<RailQueues> rails;
  // What this transport's own operations fail with (CANCELLED after Shutdown, UNAVAILABLE once
  // killed), and what its peers' operations to it fail with (UNAVAILABLE).
  absl::Status own_failure;
  absl::Status peer_failure;
};

struct InProcFabric::EndpointState {
  std::shared_ptr<Node> local;
  int local_rail = 0;  // where its receives are posted
  std::shared_ptr<Node> peer;
  int peer_rail = 0;  // where its sends land
  absl::Status aborted;
  std::unordered_set<Op*> ops;  // pending: queued, or matched and waiting for the copy
};

struct InProcFabric::Op {
  std::shared_ptr<EndpointState> ep;
  bool is_send;
  Tag tag;
  std::vector<Segment> segments;
  size_t size;            // total
  RecvCompletionFn done;  // sends ignore the length
  bool matched = false;   // taken off the queues; a Transfer is scheduled
};

namespace {

constexpr absl::string_view kScheme = "inproc://";

absl::Status CheckRail(int rail, int num_rails) {
  if (rail >= 0 && rail < num_rails) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "rail ", rail, " is out of range: this transport has rails [0, ", num_rails, ")"));
}

struct ParsedAddress {
  std::string name;
  int rail;
};

absl::StatusOr<ParsedAddress> ParseAddress(absl::string_view address) {
  const auto malformed = [&] {
    return absl::InvalidArgumentError(absl::StrCat("malformed in-process peer address \"", address,
                                                   "\": expected inproc://<name>/<rail>"));
  };
  if (!absl::StartsWith(address, kScheme)) return malformed();
  absl::string_view rest = address.substr(kScheme.size());
  const size_t slash = rest.rfind('/');
  if (slash == absl::string_view::npos || slash == 0) return malformed();
  int rail;
  const absl::string_view digits = rest.substr(slash + 1);
  // Canonical decimal only, so that each rail has exactly one address.
  if (!absl::SimpleAtoi(digits, &rail) || rail < 0 || absl::StrCat(rail) != digits) {
    return malformed();
  }
  return ParsedAddress{std::string(rest.substr(0, slash)), rail};
}

}  // namespace

// Handle the caller holds; the fabric owns the state.
class InProcEndpoint : public Endpoint {
 public:
  InProcEndpoint(std::shared_ptr<InProcFabric> fabric,
                 std::shared_ptr<InProcFabric::EndpointState> state)
      : fabric_(std::move(fabric)), state_(std::move(state)) {}
  ~InProcEndpoint() override { fabric_->Release(state_.get()); }

  void SendV(Tag tag, const Segment* segments, int count, CompletionFn done) override {
    fabric_->Start(state_, /*is_send=*/true, tag, segments, count,
                   [done = std::move(done)](absl::Status s, size_t) { done(std::move(s)); });
  }
  void RecvV(Tag tag, const Segment* segments, int count, RecvCompletionFn done) override {
    fabric_->Start(state_, /*is_send=*/false, tag, segments, count, std::move(done));
  }
  void Abort(const absl::Status& status) override { fabric_->Abort(state_.get(), status); }

 private:
  const std::shared_ptr<InProcFabric> fabric_;
  const std::shared_ptr<InProcFabric::EndpointState> state_;
};

std::shared_ptr<InProcFabric> InProcFabric::Create() {
  return std::shared_ptr<InProcFabric>(new InProcFabric());
}

InProcFabric::InProcFabric()
    : queue_(std::make_shared<WorkQueue>()), thread_([q = queue_] { q->Loop(); }) {}

InProcFabric::~InProcFabric() {
  {
    absl::MutexLock lock(&queue_->mu);
    queue_->stopping = true;
  }
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // the last reference dropped in a completion; the loop finishes alone
  } else {
    thread_.join();
  }
}

void InProcFabric::Defer(std::function<void()> fn) {
  absl::MutexLock lock(&queue_->mu);
  queue_->work.push_back(std::move(fn));
}

absl::StatusOr<std::unique_ptr<InProcTransport>> InProcFabric::NewTransport(const std::string& name,
                                                                            int num_rails) {
  if (name.empty() || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-process transport name \"", name, "\" must be non-empty without '/'"));
  }
  if (num_rails < 1) {
    return absl::InvalidArgumentError(absl::StrCat("in-process transport \"", name,
                                                   "\" needs at least one rail, not ", num_rails));
  }
  auto node = std::make_shared<Node>();
  node->name = name;
  node->num_rails = num_rails;
  node->rails.resize(num_rails);
  {
    absl::MutexLock lock(&mu_);
    if (!nodes_.emplace(name, node).second) {
      return absl::AlreadyExistsError(
          absl::StrCat("an in-process transport named \"", name, "\" already exists"));
    }
  }
  return std::unique_ptr<InProcTransport>(
      new InProcTransport(shared_from_this(), std::move(node), num_rails));
}

absl::Status InProcFabric::Kill(const std::string& address) {
  std::string name = address;
  if (absl::StartsWith(address, kScheme)) {
    absl::StatusOr<ParsedAddress> parsed = ParseAddress(address);
    if (!parsed.ok()) return parsed.status();
    name = parsed->name;
  }
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no in-process transport named \"", name, "\" to kill"));
  }
  Node* node = it->second.get();
  if (node->own_failure.ok()) {
    node->own_failure =
        absl::UnavailableError(absl::StrCat("in-process transport \"", name, "\" was killed"));
  }
  node->peer_failure = absl::UnavailableError(
      absl::StrCat("peer \"", name, "\" is unavailable: it was killed (in-process fabric)"));
  // Stays registered, like a dead host whose address still resolves: Connect succeeds, every
  // operation fails.
  FailNode(node);
  return absl::OkStatus();
}

absl::Status InProcFabric::EndpointStatus(const EndpointState& ep) const {
  if (!ep.aborted.ok()) return ep.aborted;
  if (!ep.local->own_failure.ok()) return ep.local->own_failure;
  if (!ep.peer->peer_failure.ok()) return ep.peer->peer_failure;
  return absl::OkStatus();
}

void InProcFabric::Post(Op* op) {
  EndpointState& ep = *op->ep;
  if (absl::Status status = EndpointStatus(ep); !status.ok()) {
    Finish(op, std::move(status));
    return;
  }
  // Both sides queue on the receiving transport's rail.
  RailQueues& q = op->is_send ? ep.peer->rails[ep.peer_rail] : ep.local->rails[ep.local_rail];
  auto& mine = op->is_send ? q.sends : q.recvs;
  auto& theirs = op->is_send ? q.recvs : q.sends;
  auto it = theirs.find(op->tag);
  if (it == theirs.end()) {
    mine[op->tag].push_back(op);
    return;
  }
  Op* other = it->second.front();
  it->second.pop_front();
  if (it->second.empty()) theirs.erase(it);
  op->matched = other->matched = true;
  Op* send = op->is_send ? op : other;
  Op* recv = op->is_send ? other : op;
  // The copy happens on the fabric thread, never on the caller's, and outside mu_.
  Defer([self = shared_from_this(), send, recv] { self->Transfer(send, recv); });
}

void InProcFabric::Transfer(Op* send, Op* recv) {
  {
    absl::MutexLock lock(&mu_);
    absl::Status send_status = EndpointStatus(*send->ep);
    absl::Status recv_status = EndpointStatus(*recv->ep);
    if (!send_status.ok() || !recv_status.ok()) {
      // Failed while matched: fail that side, and let the other wait for another partner.
      send->matched = recv->matched = false;
      if (send_status.ok()) {
        Post(send);
      } else {
        Finish(send, std::move(send_status));
      }
      if (recv_status.ok()) {
        Post(recv);
      } else {
        Finish(recv, std::move(recv_status));
      }
      return;
    }
    if (send->size > recv->size) {
      const Tag tag = recv->tag;
      const size_t sent = send->size;
      const size_t wanted = recv->size;
      Finish(send, absl::OkStatus());
      Finish(recv, absl::OutOfRangeError(absl::StrCat("received ", sent, " bytes tagged 0x",
                                                      absl::Hex(tag), ", more than the ", wanted,
                                                      "-byte receive buffer")));
      return;
    }
    send->ep->ops.erase(send);
    recv->ep->ops.erase(recv);
  }
  // Copies the send's segments into the receive's, in order, across segment boundaries.
  size_t r = 0, r_off = 0;
  for (const Segment& from : send->segments) {
    size_t done = 0;
    while (done < from.size) {
      while (recv->segments[r].size == r_off) {
        ++r;
        r_off = 0;
      }
      const size_t n = std::min(from.size - done, recv->segments[r].size - r_off);
      std::memcpy(static_cast<char*>(recv->segments[r].data) + r_off,
                  static_cast<const char*>(from.data) + done, n);
      done += n;
      r_off += n;
    }
  }
  const size_t length = send->size;
  RecvCompletionFn send_done = std::move(send->done);
  RecvCompletionFn recv_done = std::move(recv->done);
  delete send;
  delete recv;
  send_done(absl::OkStatus(), length);
  recv_done(absl::OkStatus(), length);
}

void InProcFabric::Finish(Op* op, absl::Status status) {
  op->ep->ops.erase(op);
  Defer([done = std::move(op->done), status = std::move(status)] { done(status, 0); });
  delete op;
}

void InProcFabric::FailEndpoint(EndpointState* ep) {
  const absl::Status status = EndpointStatus(*ep);
  if (status.ok()) return;
  const std::vector<Op*> ops(ep->ops.begin(), ep->ops.end());
  for (Op* op : ops) {
    if (op->matched) continue;  // its Transfer sees the failure
    RailQueues& q = op->is_send ? ep->peer->rails[ep->peer_rail] : ep->local->rails[ep->local_rail];
    auto& queues = op->is_send ? q.sends : q.recvs;
    auto it = queues.find(op->tag);
    if (it != queues.end()) {
      auto& deque = it->second;
      deque.erase(std::remove(deque.begin(), deque.end(), op), deque.end());
      if (deque.empty()) queues.erase(it);
    }
    Finish(op, status);
  }
}

void InProcFabric::FailNode(Node* node) {
  for (EndpointState* ep : endpoints_) {
    if (ep->local.get() == node || ep->peer.get() == node) FailEndpoint(ep);
  }
}

absl::StatusOr<std::shared_ptr<InProcFabric::EndpointState>> InProcFabric::Connect(
    const std::shared_ptr<Node>& local, int rail, const std::string& address) {
  absl::StatusOr<ParsedAddress> parsed = ParseAddress(address);
  if (!parsed.ok()) return parsed.status();
  absl::MutexLock lock(&mu_);
  if (absl::IsCancelled(local->own_failure)) {
    return absl::FailedPreconditionError(
        absl::StrCat("in-process transport \"", local->name, "\" is shut down; cannot connect"));
  }
  auto it = nodes_.find(parsed->name);
  if (it == nodes_.end()) {
    return absl::UnavailableError(absl::StrCat("no in-process transport named \"", parsed->name,
                                               "\" on this fabric (address \"", address, "\")"));
  }
  if (parsed->rail >= it->second->num_rails) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" names rail ",
                                                   parsed->rail, " but \"", parsed->name, "\" has ",
                                                   it->second->num_rails));
  }
  auto ep = std::make_shared<EndpointState>();
  ep->local = local;
  ep->local_rail = rail;
  ep->peer = it->second;
  ep->peer_rail = parsed->rail;
  endpoints_.insert(ep.get());
  return ep;
}

void InProcFabric::Start(const std::shared_ptr<EndpointState>& ep, bool is_send, Tag tag,
                         const Segment* segments, int count, RecvCompletionFn done) {
  if (count < 1 || count > kMaxSegments) {
    absl::MutexLock lock(&mu_);
    Defer([done = std::move(done), count] {
      done(absl::InvalidArgumentError(
               absl::StrCat("an operation takes 1 to ", kMaxSegments, " segments, not ", count)),
           0);
    });
    return;
  }
  auto* op = new Op{ep,
                    is_send,
                    tag,
                    std::vector<Segment>(segments, segments + count),
                    TotalSize(segments, count),
                    std::move(done)};
  absl::MutexLock lock(&mu_);
  ep->ops.insert(op);
  Post(op);
}

void InProcFabric::Abort(EndpointState* ep, absl::Status status) {
  if (status.ok()) status = absl::CancelledError("endpoint aborted (with an OK status)");
  absl::MutexLock lock(&mu_);
  if (ep->aborted.ok()) ep->aborted = std::move(status);
  FailEndpoint(ep);
}

void InProcFabric::Release(EndpointState* ep) {
  absl::MutexLock lock(&mu_);
  if (ep->aborted.ok()) {
    ep->aborted = absl::CancelledError(
        absl::StrCat("endpoint to \"", ep->peer->name, "\" was released with operations pending"));
  }
  FailEndpoint(ep);
  endpoints_.erase(ep);
}

void InProcFabric::Shutdown(Node* node) {
  absl::MutexLock lock(&mu_);
  if (node->own_failure.ok()) {
    node->own_failure =
        absl::CancelledError(absl::StrCat("in-process transport \"", node->name, "\" shut down"));
  } else if (!absl::IsUnavailable(node->own_failure)) {
    return;  // shut down already
  }
  if (node->peer_failure.ok()) {
    node->peer_failure = absl::UnavailableError(
        absl::StrCat("peer \"", node->name, "\" is unavailable: it shut down"));
  }
  auto it = nodes_.find(node->name);
  if (it != nodes_.end() && it->second.get() == node) nodes_.erase(it);
  FailNode(node);
}

InProcTransport::InProcTransport(std::shared_ptr<InProcFabric> fabric,
                                 std::shared_ptr<InProcFabric::Node> node, int num_rails)
    : fabric_(std::move(fabric)), node_(std::move(node)), num_rails_(num_rails) {}

InProcTransport::~InProcTransport() { Shutdown(); }

const std::string& InProcTransport::name() const { return node_->name; }

absl::StatusOr<std::string> InProcTransport::LocalAddress(int rail) {
  if (absl::Status s = CheckRail(rail, num_rails_); !s.ok()) return s;
  return absl::StrCat(kScheme, node_->name, "/", rail);
}

absl::StatusOr<std::shared_ptr<Endpoint>> InProcTransport::Connect(const std::string& peer_address,
                                                                   int rail) {
  if (absl::Status s = CheckRail(rail, num_rails_); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<InProcFabric::EndpointState>> state =
      fabric_->Connect(node_, rail, peer_address);
  if (!state.ok()) return state.status();
  return std::make_shared<InProcEndpoint>(fabric_, *std::move(state));
}

void InProcTransport::Shutdown() { fabric_->Shutdown(node_.get()); }

}  // namespace railyard::transport
