// Fuzz target: the peer plane's communicator bootstrap (proto/railyard/v1/peer.proto,
// daemon/comm/bootstrap.h, daemon/comm/peer_input.h), both sides of Peer.JoinComm. Byte 0 picks
// the side:
//  even: the rest is the JoinCommResponse a member receives from a coordinator. Properties: a
//        layout CheckLayoutFits accepts is one DaemonCore builds a communicator from without
//        reading out of bounds: CommLayout::FromNodeOfRank over its node_of_rank gives exactly
//        its nodes, each holding a rank and a distinct daemon, every rank on a node, at most
//        kMaxRanks ranks. A layout CheckLayoutFromCoordinator accepts (for the last rank of as
//        many as it lists, this daemon being the node named "me") also lists "me" exactly once
//        where that rank is, and every field is within the limits of peer_input.h: names,
//        host:port addresses, rail addresses, rails, integrity, a non-zero secret on more than one
//        node, the cost model's texts. Refusals are INVALID_ARGUMENT or FAILED_PRECONDITION with
//        bounded messages.
//  odd:  the rest is a sequence of JoinCommRequests (each a 2-byte little-endian length and the
//        message) a coordinator ("a:7411") receives from peers, alternately from an unverified
//        peer and from one whose certificate names only node "a". Each goes through
//        CheckJoinRequest (refused: INVALID_ARGUMENT or PERMISSION_DENIED, or FAILED_PRECONDITION
//        for another data-plane version, bounded; accepted:
//        every field within its limits, a certified peer speaking only as "a") and, whatever it
//        said, CommBootstrap::Join on a fake clock with at most 4 bootstraps and 16 KiB of node
//        information pending (both back to 0 after every deadline). Properties:
//        a join is accepted or refused at once with INVALID_ARGUMENT, ALREADY_EXISTS,
//        PERMISSION_DENIED or RESOURCE_EXHAUSTED; no comm id accepts joins of two jobs; once the
//        clock passes every deadline each accepted join has had its answer exactly once; every
//        layout answered has one node per distinct daemon, one node_of_rank entry per rank,
//        passes CheckLayoutFits, and carries a non-zero secret and a known integrity mode.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/comm/bootstrap.h"
#include "daemon/comm/comm_id.h"
#include "daemon/comm/host_port.h"
#include "daemon/comm/peer_identity.h"
#include "daemon/comm/peer_input.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/scheduler/tags.h"
#include "daemon/util/clock.h"
#include "daemon/util/deadline_timer.h"
#include "railyard/v1/peer.pb.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/quiet_protobuf.h"

namespace railyard {
namespace {

constexpr char kCommId[] = "ry1-0123456789abcdef0123456789abcdef@fuzz:1";

bool NameOk(const std::string& name) {
  if (name.empty() || name.size() > kMaxNodeNameBytes) return false;
  for (char c : name) {
    if (c <= ' ' || c >= 0x7f) return false;  // char may be signed: bytes >= 0x80 are negative
  }
  return true;
}

// What CheckLayoutFromCoordinator promises about a layout it accepted.
void CheckCheckedLayout(const v1::JoinCommResponse& layout) {
  const int nranks = layout.node_of_rank_size();
  LayoutAsk ask;
  ask.comm_id = kCommId;
  ask.rank = nranks > 0 ? nranks - 1 : 0;
  ask.nranks = nranks;
  ask.is_me = [](const v1::NodeInfo& n) { return n.node_name() == "me"; };
  absl::StatusOr<int> me = CheckLayoutFromCoordinator(layout, ask);
  if (!me.ok()) {
    if (me.status().code() != absl::StatusCode::kFailedPrecondition) {
      FUZZ_CHECK_ERROR(me.status(), absl::StatusCode::kInvalidArgument, 600);
    }
    return;
  }
  const int nodes = layout.nodes_size();
  FUZZ_CHECK(*me >= 0 && *me < nodes, absl::StrCat("my node ", *me, " of ", nodes));
  FUZZ_CHECK(layout.node_of_rank(ask.rank) == *me, "the asking rank is not on this daemon");
  int mine = 0;
  for (int n = 0; n < nodes; ++n) {
    const v1::NodeInfo& node = layout.nodes(n);
    mine += node.node_name() == "me";
    FUZZ_CHECK(NameOk(node.node_name()), absl::StrCat("node ", n, " has a bad name"));
    if (nodes > 1 || !node.peer_address().empty()) {
      FUZZ_CHECK(HostPortProblem(node.peer_address()).empty(),
                 absl::StrCat("node ", n, " address ", node.peer_address().substr(0, 80)));
    }
    FUZZ_CHECK(node.rail_addresses_size() <= kMaxRailAddresses,
               absl::StrCat(node.rail_addresses_size(), " rail addresses"));
    for (const std::string& a : node.rail_addresses()) {
      FUZZ_CHECK(a.size() <= kMaxRailAddressBytes, absl::StrCat("rail address of ", a.size()));
    }
  }
  FUZZ_CHECK(mine == 1, absl::StrCat("this daemon listed ", mine, " times"));
  FUZZ_CHECK(layout.rails() >= 1 && layout.rails() <= kMaxRailAddresses,
             absl::StrCat("rails ", layout.rails()));
  FUZZ_CHECK(
      layout.integrity().empty() || layout.integrity() == "none" || layout.integrity() == "crc32c",
      "unknown integrity accepted");
  FUZZ_CHECK(nodes <= 1 || layout.data_secret() != 0, "multi-node layout without a secret");
  const v1::CostModel& m = layout.cost_model();
  for (const std::string* t :
       {&m.source(), &m.op(), &m.algorithm(), &m.placement(), &m.topology(), &m.fitted_at()}) {
    FUZZ_CHECK(t->size() <= kMaxCostModelTextBytes, absl::StrCat("cost text of ", t->size()));
  }
}

void CheckMemberLayout(const uint8_t* data, size_t size) {
  v1::JoinCommResponse layout;
  if (!layout.ParseFromArray(data, static_cast<int>(size))) return;
  CheckCheckedLayout(layout);
  const absl::Status fits = CommBootstrap::CheckLayoutFits(layout, kCommId);
  if (!fits.ok()) {
    FUZZ_CHECK(fits.code() == absl::StatusCode::kInvalidArgument ||
                   fits.code() == absl::StatusCode::kFailedPrecondition,
               fits.ToString());
    return;
  }
  // DaemonCore builds a multi-node communicator from what it accepts (MakeMultiNodeComm): the
  // node of every rank, then layout.nodes(n) for each node the ranks name.
  if (layout.nodes_size() <= 1) return;
  const std::vector<int> node_of_rank(layout.node_of_rank().begin(), layout.node_of_rank().end());
  FUZZ_CHECK(!node_of_rank.empty() && node_of_rank.size() <= scheduler::tags::kMaxRanks,
             absl::StrCat("accepted a layout of ", node_of_rank.size(), " ranks"));
  for (int n : node_of_rank) {
    FUZZ_CHECK(n >= 0 && n < layout.nodes_size(),
               absl::StrCat("accepted node_of_rank ", n, " with ", layout.nodes_size(), " nodes"));
  }
  std::set<std::string> daemons;
  for (const v1::NodeInfo& node : layout.nodes()) {
    FUZZ_CHECK(daemons.insert(CommBootstrap::NodeId(node)).second,
               "accepted a layout listing one daemon twice");
  }
  const scheduler::CommLayout l = scheduler::CommLayout::FromNodeOfRank(node_of_rank, 1);
  FUZZ_CHECK(l.nnodes == layout.nodes_size(),
             absl::StrCat("ranks span ", l.nnodes, " nodes of ", layout.nodes_size()));
  for (int n = 0; n < l.nnodes; ++n) {
    FUZZ_CHECK(!l.ranks_of_node[n].empty(), absl::StrCat("node ", n, " holds no rank"));
  }
}

class FakeClock final : public Clock {
 public:
  absl::Time Now() const override { return now_; }
  void Advance(absl::Duration d) { now_ += d; }

 private:
  absl::Time now_ = absl::FromUnixSeconds(1'000'000'000);
};

struct Answer {
  int calls = 0;
  absl::Status status;
  v1::JoinCommResponse layout;
  int nranks = 0;
};

void CheckAnswer(const Answer& a) {
  if (!a.status.ok()) {
    FUZZ_CHECK(a.status.code() == absl::StatusCode::kDeadlineExceeded ||
                   a.status.code() == absl::StatusCode::kInvalidArgument ||
                   a.status.code() == absl::StatusCode::kFailedPrecondition,
               a.status.ToString());
    return;
  }
  FUZZ_CHECK(
      a.layout.node_of_rank_size() == a.nranks,
      absl::StrCat(a.layout.node_of_rank_size(), " node_of_rank entries for ", a.nranks, " ranks"));
  const absl::Status fits = CommBootstrap::CheckLayoutFits(a.layout, kCommId);
  FUZZ_CHECK(fits.ok(),
             absl::StrCat("the coordinator answered a layout that does not fit: ", fits.message()));
  FUZZ_CHECK(a.layout.data_secret() != 0, "a layout without a data secret");
  FUZZ_CHECK(a.layout.integrity().empty() || a.layout.integrity() == "crc32c",
             absl::StrCat("integrity '", a.layout.integrity().substr(0, 32), "'"));
  std::vector<bool> used(a.layout.nodes_size(), false);
  for (int n : a.layout.node_of_rank()) {
    FUZZ_CHECK(n >= 0 && n < a.layout.nodes_size(), absl::StrCat("node_of_rank ", n));
    used[n] = true;
  }
  std::set<std::string> daemons;
  for (int n = 0; n < a.layout.nodes_size(); ++n) {
    FUZZ_CHECK(used[n], absl::StrCat("node ", n, " of the answer holds no rank"));
    FUZZ_CHECK(daemons.insert(CommBootstrap::NodeId(a.layout.nodes(n))).second,
               "one daemon is two nodes of the layout");
  }
}

constexpr char kCoordinator[] = "a:7411";

// What CheckJoinRequest promises about a request it accepted from `who`.
void CheckCheckedJoin(const PeerIdentity& who, const v1::JoinCommRequest& req) {
  const absl::Status s = CheckJoinRequest(who, req, kCoordinator);
  if (!s.ok()) {
    if (s.code() == absl::StatusCode::kPermissionDenied) {
      FUZZ_CHECK_ERROR(s, absl::StatusCode::kPermissionDenied, 600);
    } else if (s.code() == absl::StatusCode::kFailedPrecondition) {
      FUZZ_CHECK_ERROR(s, absl::StatusCode::kFailedPrecondition, 600);
      FUZZ_CHECK(req.node().data_plane_version() != kDataPlaneVersion,
                 "FAILED_PRECONDITION for a join of this daemon's data-plane version");
    } else {
      FUZZ_CHECK_ERROR(s, absl::StatusCode::kInvalidArgument, 600);
    }
    return;
  }
  absl::StatusOr<CommId> id = ParseCommId(req.comm_id());
  FUZZ_CHECK(id.ok() && id->coordinator == kCoordinator, "accepted a foreign comm id");
  FUZZ_CHECK(req.nranks() >= 1 && req.nranks() <= scheduler::tags::kMaxRanks && req.rank() >= 0 &&
                 req.rank() < req.nranks(),
             absl::StrCat("rank ", req.rank(), " of ", req.nranks()));
  FUZZ_CHECK(!req.job_id().empty() && req.job_id().size() <= 128, "job id");
  FUZZ_CHECK(NameOk(req.node().node_name()), "node name");
  FUZZ_CHECK(HostPortProblem(req.node().peer_address()).empty(), "peer address");
  FUZZ_CHECK(req.node().rail_addresses_size() <= kMaxRailAddresses, "rail addresses");
  for (const std::string& a : req.node().rail_addresses()) {
    FUZZ_CHECK(a.size() <= kMaxRailAddressBytes, absl::StrCat("rail address of ", a.size()));
  }
  FUZZ_CHECK(!who.authenticated || req.node().node_name() == "a",
             absl::StrCat("a peer certified as 'a' joined as '",
                          req.node().node_name().substr(0, 64), "'"));
}

void CheckCoordinator(const uint8_t* data, size_t size) {
  FakeClock clock;
  DeadlineTimer timer(&clock);
  CommBootstrap bootstrap(&timer, {/*max_pending=*/4, /*remembered_formed=*/4096,
                                   /*max_pending_bytes=*/16 << 10});
  PeerIdentity insecure;
  PeerIdentity certified;
  certified.authenticated = true;
  certified.dns_names = {"a"};
  std::vector<std::shared_ptr<Answer>> accepted;
  std::map<std::string, std::string> job_of_comm;  // the first job each comm id accepted
  int index = 0;
  while (size >= 2) {
    const size_t len = std::min<size_t>(data[0] | (data[1] << 8), size - 2);
    v1::JoinCommRequest req;
    const bool parsed = req.ParseFromArray(data + 2, static_cast<int>(len));
    data += 2 + len;
    size -= 2 + len;
    if (!parsed) continue;
    CheckCheckedJoin(index++ % 2 == 0 ? insecure : certified, req);
    auto answer = std::make_shared<Answer>();
    answer->nranks = req.nranks();
    // As CommJoins::CoordinateJoin: the request's timeout, a default for 0.
    const absl::Duration timeout =
        req.timeout_ms() > 0 ? absl::Milliseconds(req.timeout_ms()) : absl::Seconds(60);
    const absl::Status s =
        bootstrap.Join(req, timeout, [answer](const absl::StatusOr<v1::JoinCommResponse>& r) {
          ++answer->calls;
          answer->status = r.status();
          if (r.ok()) answer->layout = *r;
        });
    if (s.ok()) {
      accepted.push_back(answer);
      const auto [first, inserted] = job_of_comm.emplace(req.comm_id(), req.job_id());
      FUZZ_CHECK(inserted || first->second == req.job_id(), "a comm id accepted joins of two jobs");
    } else {
      FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument ||
                     s.code() == absl::StatusCode::kAlreadyExists ||
                     s.code() == absl::StatusCode::kPermissionDenied ||
                     s.code() == absl::StatusCode::kResourceExhausted,
                 s.ToString());
      FUZZ_CHECK(answer->calls == 0, "a refused join was answered");
    }
  }
  for (const auto& a : accepted) {
    FUZZ_CHECK(a->calls <= 1, absl::StrCat("a join answered ", a->calls, " times"));
  }
  clock.Advance(absl::Hours(24 * 50));  // past the longest timeout_ms (2^32 ms)
  timer.RunDue();
  FUZZ_CHECK(bootstrap.pending() == 0 && bootstrap.pending_bytes() == 0,
             absl::StrCat(bootstrap.pending(), " bootstraps holding ", bootstrap.pending_bytes(),
                          " bytes left after every deadline"));
  for (const auto& a : accepted) {
    FUZZ_CHECK(a->calls == 1, absl::StrCat("a join answered ", a->calls, " times"));
    CheckAnswer(*a);
  }
}

}  // namespace
}  // namespace railyard

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if (data[0] % 2 == 0) {
    railyard::CheckMemberLayout(data + 1, size - 1);
  } else {
    railyard::CheckCoordinator(data + 1, size - 1);
  }
  return 0;
}
