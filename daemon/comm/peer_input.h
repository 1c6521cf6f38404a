// What another daemon sends over the peer plane (proto/railyard/v1/peer.proto), checked before
// anything is stored, sized or dialled from it: the JoinComm requests a coordinator receives, the
// layouts members receive back, and the node names Heartbeat and AbortComm speak for. Every
// refusal names the field ("JoinCommRequest.node.rail_addresses[3] is 70000 bytes, more than
// 16384"). Shared by the coordinator (CommJoins::CoordinateJoin) and the members
// (CommJoins::OnLayout), and fuzzed by tests/fuzz/peer_join_fuzz.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/comm/peer_identity.h"
#include "railyard/v1/peer.pb.h"

namespace railyard {

// A daemon's name (NodeInfo.node_name, HeartbeatRequest.from_node, AbortCommRequest.from_node):
// 1..255 printable ASCII bytes, no space (it is written into local:<node> comm ids).
inline constexpr size_t kMaxNodeNameBytes = 255;
// Rails one node may announce, and the bytes of one rail's UCX worker address (hex text, twice
// the raw address: tcp's are a few hundred bytes; a worker with rc, dc and ud lanes on one NIC a
// few KiB, hence the room).
inline constexpr int kMaxRailAddresses = 64;
inline constexpr size_t kMaxRailAddressBytes = 16384;
// NodeInfo.paced_chunk_bytes, when set: smaller would let one member force a schedule too finely
// chunked to number; larger than any chunk the tuner picks means nothing.
inline constexpr uint64_t kMinPacedChunkBytes = 16 * 1024;
inline constexpr uint64_t kMaxPacedChunkBytes = uint64_t{1} << 30;
// Each descriptive text field of a coordinator's CostModel (source, op, fitted_at, ...).
inline constexpr size_t kMaxCostModelTextBytes = 256;
// The inter-node data plane this daemon speaks (NodeInfo.data_plane_version). Raise it with any
// change two daemons must agree on to exchange data: the frame trailer, the tag layout, the
// operation digest and what it carries, a schedule generator's messages. Daemons of different
// versions (a rolling upgrade half done) refuse to form a communicator, naming both versions,
// instead of misreading each other's messages. 2: the digests gathered by recursive doubling
// (digest_summary.h) and a node's chunks striped over its rails when it has fewer ranks than
// rails (CommLayout::rail_for).
inline constexpr uint32_t kDataPlaneVersion = 2;

// INVALID_ARGUMENT "<field> ..." unless name is a node name as above.
absl::Status CheckNodeName(absl::string_view name, absl::string_view field);
// A node name the caller speaks as (a join's node, a heartbeat's or abort's from_node): valid
// (CheckNodeName, INVALID_ARGUMENT) and claimable by the caller's certificate
// (PeerIdentity::MayClaimNode, PERMISSION_DENIED), both naming field.
absl::Status CheckClaimedNode(const PeerIdentity& who, absl::string_view name,
                              absl::string_view field);
// A NodeInfo's name, peer address (host:port, daemon/comm/host_port.h; may be empty only when
// !address_required), rail addresses (count and size) and tag slot (fits the tag layout).
absl::Status CheckNodeInfo(const v1::NodeInfo& node, absl::string_view field,
                           bool address_required);
// The integrity modes a member may ask for and a coordinator may answer: "", "none", "crc32c".
absl::Status CheckIntegrity(absl::string_view value, absl::string_view field);
// The stronger of two known modes ("crc32c" over "none" and ""); "" when both are off.
std::string StrongerIntegrity(absl::string_view a, absl::string_view b);

// Everything of a JoinComm at the coordinator, before the bootstrap stores any of it: job_id
// (the local API's rule, ValidJobId), comm_id (well formed, naming `coordinator`, this daemon's
// name in comm ids), rank and nranks (CheckRankOf), the node (CheckNodeInfo; the peer address may
// be empty only for this daemon's own joins) and integrity. INVALID_ARGUMENT naming the field;
// PERMISSION_DENIED when `who` may not speak for node.node_name (PeerIdentity::MayClaimNode);
// FAILED_PRECONDITION, last, when another daemon's node speaks another data-plane version.
absl::Status CheckJoinRequest(const PeerIdentity& who, const v1::JoinCommRequest& req,
                              absl::string_view coordinator);

// What a member asked the coordinator for, to check the layout answered against.
struct LayoutAsk {
  std::string comm_id;
  int rank = 0;
  int nranks = 0;
  // True for this daemon's NodeInfo.
  std::function<bool(const v1::NodeInfo&)> is_me;
};
// The layout a member receives (from another daemon: untrusted), before it indexes or dials
// anything with it: CommBootstrap::CheckLayoutFits, as many node_of_rank entries as ranks asked
// for, this daemon listed exactly once and holding the asking rank, every node bounded
// (CheckNodeInfo; peer addresses required on more than one node), 1 <= rails <= kMaxRailAddresses,
// a known integrity mode, a non-zero data_secret on more than one node, the cost model's texts
// bounded; last, on more than one node, every node speaking kDataPlaneVersion
// (FAILED_PRECONDITION naming the node and both versions). Returns this daemon's node index;
// INVALID_ARGUMENT (FAILED_PRECONDITION where CheckLayoutFits says so) naming the field and that
// it came from the coordinator.
// FAILED_PRECONDITION unless node speaks kDataPlaneVersion: "<field>: node N speaks data-plane
// version V, this daemon W ...".
absl::Status CheckDataPlaneVersion(const v1::NodeInfo& node, absl::string_view field);

absl::StatusOr<int> CheckLayoutFromCoordinator(const v1::JoinCommResponse& layout,
                                               const LayoutAsk& ask);

}  // namespace railyard
