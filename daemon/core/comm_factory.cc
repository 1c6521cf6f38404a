#include "daemon/core/comm_factory.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/core/cost_model_proto.h"
#include "daemon/metrics/counting_endpoint.h"
#include "daemon/scheduler/cost/calibration.h"
#include "daemon/transport/framed_endpoint.h"
#include "daemon/transport/integrity.h"
#include "daemon/util/log.h"

namespace railyard {
namespace {

// At most one log line per second per link for dropped foreign messages (a flood must not
// flood the log); the next line says how many were not logged.
class LogLimiter {
 public:
  bool Allow(int* suppressed) {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - last_ < absl::Seconds(1)) {
      ++suppressed_;
      return false;
    }
    last_ = now;
    *suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

 private:
  absl::Mutex mu_;
  absl::Time last_ = absl::InfinitePast();
  int suppressed_ = 0;
};

}  // namespace

absl::StatusOr<transport::Integrity> AskedIntegrity(const std::string& daemon,
                                                    const std::string& rank) {
  absl::StatusOr<transport::Integrity> d = transport::ParseIntegrity(daemon);
  if (!d.ok()) return d.status();
  absl::StatusOr<transport::Integrity> asked = transport::ParseIntegrity(rank);
  if (!asked.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("InitComm integrity: ", asked.status().message()));
  }
  return transport::Stronger(*d, *asked);
}

DaemonCommFactory::DaemonCommFactory(const DaemonConfig& config, Deps deps,
                                     transport::LinkStack link_stack)
    : config_(config), deps_(deps), link_stack_(std::move(link_stack)) {}

void DaemonCommFactory::SetFabric(transport::Transport* transport,
                                  std::vector<std::string> rail_names,
                                  std::vector<std::shared_ptr<transport::FairQueue>> rail_queues) {
  transport_ = transport;
  rail_names_ = std::move(rail_names);
  rail_queues_ = std::move(rail_queues);
}

CommEnv DaemonCommFactory::Env() const {
  CommEnv env{deps_.executor,     deps_.timer,          config_.chunk_bytes,
              config_.op_timeout, config_.init_timeout, config_.algo};
  env.metrics = deps_.metrics;
  env.inline_max_bytes = config_.inline_max_bytes;
  return env;
}

std::shared_ptr<Communicator> DaemonCommFactory::MakeLocal(const std::string& job,
                                                           const std::string& comm_id, int nranks,
                                                           const v1::CostModel& model) {
  return std::make_shared<Communicator>(
      comm_id, job, nranks, Env(), MakeTuner(scheduler::CommLayout::Uniform(1, nranks, 1), model));
}

absl::StatusOr<std::shared_ptr<Communicator>> DaemonCommFactory::MakeMultiNode(
    const std::string& job, const std::string& comm_id, const v1::JoinCommResponse& layout,
    int my_node, std::shared_ptr<const scheduler::tags::Slot> slot,
    const std::string& asked_integrity) {
  if (transport_ == nullptr || slot == nullptr) {
    return absl::FailedPreconditionError("this daemon has no transport (--peer_listen unset)");
  }
  // OnLayout checked the layout (CheckLayoutFromCoordinator) before calling this.
  MultiNodeEnv net;
  for (const v1::NodeInfo& node : layout.nodes()) {
    net.node_slots.push_back(static_cast<uint16_t>(node.tag_slot()));
  }
  if (net.node_slots[my_node] != slot->value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout of communicator ", comm_id,
                     " from its coordinator: JoinCommResponse.nodes[", my_node, "].tag_slot is ",
                     net.node_slots[my_node], ", this daemon announced ", slot->value()));
  }
  net.tag_slot = std::move(slot);
  // The coordinator merges what the members asked for into the layout; a member never runs
  // with less than it asked for itself.
  absl::StatusOr<transport::Integrity> asked = AskedIntegrity(config_.integrity, asked_integrity);
  absl::StatusOr<transport::Integrity> given = transport::ParseIntegrity(layout.integrity());
  if (!asked.ok()) return asked.status();
  if (!given.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("the coordinator's layout of communicator ",
                                                      comm_id, ": ", given.status().message()));
  }
  const transport::Integrity integrity = transport::Stronger(*asked, *given);
  const int rails = std::max(1, std::min(layout.rails(), transport_->num_rails()));
  net.layout = scheduler::CommLayout::FromNodeOfRank(
      std::vector<int>(layout.node_of_rank().begin(), layout.node_of_rank().end()), rails);
  const scheduler::CommLayout& l = net.layout;
  net.my_node = my_node;
  // Every member reads the same layout, so every member chunks alike.
  for (const v1::NodeInfo& node : layout.nodes()) {
    const uint64_t c = node.paced_chunk_bytes();
    if (c != 0 && (net.max_chunk_bytes == 0 || c < net.max_chunk_bytes)) net.max_chunk_bytes = c;
  }
  net.endpoints.assign(l.nnodes, {});
  for (int n = 0; n < l.nnodes; ++n) {
    const v1::NodeInfo& node = layout.nodes(n);
    net.node_names.push_back(node.node_name());
    net.node_addresses.push_back(node.peer_address());
    net.links.emplace_back(l.rails, nullptr);
    if (n == my_node) continue;
    net.endpoints[n].resize(l.rails);
    for (int r = 0; r < l.rails; ++r) {
      if (r >= node.rail_addresses_size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("node ", node.node_name(), " has no address for rail ", r));
      }
      absl::StatusOr<std::shared_ptr<transport::Endpoint>> ep =
          transport_->Connect(node.rail_addresses(r), r);
      if (!ep.ok()) {
        return absl::UnavailableError(absl::StrCat("cannot connect to node ", node.node_name(),
                                                   " on rail ", r, ": ", ep.status().message()));
      }
      // Rails are aligned (this node's rail r talks to the peer's rail r): label by our name.
      const std::string rail_name =
          r < static_cast<int>(rail_names_.size()) ? rail_names_[r] : absl::StrCat("rail", r);
      const metrics::LinkCounters* link =
          deps_.metrics != nullptr ? deps_.metrics->ForLink(node.node_name(), rail_name) : nullptr;
      net.links[n][r] = link;
      // Every message carries the communicator's secret (and its CRC under crc32c): see
      // daemon/transport/framed_endpoint.h and docs/data-plane.md.
      transport::LinkStack::Link stack;
      stack.wire = *std::move(ep);
      stack.rail = r;
      transport::FramedEndpoint::Options& frame = stack.frame;
      frame.secret = layout.data_secret();
      frame.integrity = integrity;
      frame.node = config_.node_name;
      frame.peer = node.node_name();
      frame.rail = rail_name;
      if (config_.test_frame_split_min_bytes >= 0) {  // benchmarks only
        frame.split_min_bytes = static_cast<size_t>(config_.test_frame_split_min_bytes);
      }
      auto limiter = std::make_shared<LogLimiter>();
      frame.on_rejected = [link, limiter, comm_id, job](const absl::Status& why) {
        if (link != nullptr) link->rejected_messages->Increment();
        int suppressed = 0;
        if (limiter->Allow(&suppressed)) {
          Log(LogLevel::kWarning, "transport", "dropped a message that is not a member's",
              {F("comm", comm_id), F("job", job), F("reason", why.message()),
               F("suppressed_since_last", suppressed)});
        }
      };
      frame.on_integrity_error = [link] {
        if (link != nullptr) link->integrity_errors->Increment();
      };
      // Large messages' CRCs are verified on the executor, not on the rail's progress thread
      // (which would stop progressing the rail meanwhile); docs/data-plane.md "Cost".
      scheduler::Executor* executor = deps_.executor;
      frame.offload = [executor](std::function<void()> task) { executor->Post(std::move(task)); };
      if (deps_.metrics != nullptr) {
        metrics::DaemonMetrics* m = deps_.metrics;
        stack.observe = [m, link, job](std::shared_ptr<transport::Endpoint> framed) {
          return std::make_shared<metrics::CountingEndpoint>(
              std::move(framed), link, m->JobFabricBytes(job), m->ucx_endpoints());
        };
      }
      // A paced rail: every job's sends wait their turn in the rail's fair queue.
      if (r < static_cast<int>(rail_queues_.size())) stack.pace = rail_queues_[r];
      stack.job = job;
      stack.comm_id = comm_id;
      std::shared_ptr<transport::Endpoint> ep_out = link_stack_.Build(std::move(stack));
      net.endpoints[n][r] = std::move(ep_out);
    }
  }
  // (address, node name): with TLS each peer's certificate must name the node the layout says.
  std::vector<std::pair<std::string, std::string>> peers;
  for (int n = 0; n < l.nnodes; ++n) {
    if (n != my_node) peers.emplace_back(net.node_addresses[n], net.node_names[n]);
  }
  const std::string me = config_.node_name;
  PeerCalls* clients = deps_.peers;
  net.notify_peers = [clients, peers, job, comm_id, me](const absl::Status& status,
                                                        std::optional<uint64_t> unrun_seq) {
    if (clients == nullptr) return;
    v1::AbortCommRequest abort;
    abort.set_job_id(job);
    abort.set_comm_id(comm_id);
    abort.set_code(static_cast<int32_t>(status.code()));
    abort.set_message(std::string(status.message()));
    abort.set_from_node(me);
    if (unrun_seq.has_value()) abort.set_unrun_seq(*unrun_seq);
    for (const auto& [addr, node] : peers) clients->AbortComm(addr, node, abort);
  };
  net.notify_departed = [clients, peers, job, comm_id, me](const std::vector<int>& ranks,
                                                           const absl::Status& why) {
    if (clients == nullptr) return;
    v1::AbortCommRequest notice;
    notice.set_job_id(job);
    notice.set_comm_id(comm_id);
    notice.set_code(static_cast<int32_t>(absl::StatusCode::kAborted));
    notice.set_message(std::string(why.message()));
    notice.set_from_node(me);
    for (int r : ranks) notice.add_departed_ranks(r);
    for (const auto& [addr, node] : peers) clients->AbortComm(addr, node, notice);
  };
  net.tuner = MakeTuner(net.layout, layout.cost_model());
  return std::make_shared<Communicator>(comm_id, job, Env(), std::move(net));
}

std::shared_ptr<scheduler::cost::Tuner> DaemonCommFactory::MakeTuner(
    const scheduler::CommLayout& layout, const v1::CostModel& model) const {
  scheduler::cost::Calibration c = FromProto(model);
  if (!scheduler::cost::Validate(c).ok())
    c = scheduler::cost::Calibration::Defaults();  // an old coordinator
  scheduler::cost::TunerOptions options;
  // Chunk sizes up to --chunk_bytes; small schedules only, so a new shape costs milliseconds.
  // Across daemons no larger: with the 512 KiB segments railyardd gives UCX's tcp transport, a
  // message of 512 KiB or more goes by rendezvous, which over tcp (under the rails' peer error
  // handling) falls back to active messages and a copy, and measured dearer than the pipeline it
  // saves (docs/data-plane.md, "What a message and a reduction cost a daemon"). A fabric with a
  // zero-copy rendezvous raises --chunk_bytes.
  const size_t chunk = config_.chunk_bytes;
  options.chunk_sizes = {std::max<size_t>(chunk / 4, 16 << 10),
                         std::max<size_t>(chunk / 2, 16 << 10), chunk};
  options.max_ir_transfers = 20'000;
  options.op_overhead_s = c.op_overhead_s;
  options.message_cpu_s = c.message_cpu_s;
  options.reduce_bytes_per_s = c.reduce_bytes_per_s;
  return std::make_shared<scheduler::cost::Tuner>(
      layout, scheduler::cost::FabricForLayout(layout, c.intra, c.inter, c.overhead_s), options);
}

}  // namespace railyard
