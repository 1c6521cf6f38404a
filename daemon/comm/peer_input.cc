#include "daemon/comm/peer_input.h"

#include "absl/strings/str_cat.h"
#include "daemon/comm/bootstrap.h"
#include "daemon/comm/comm_id.h"
#include "daemon/comm/host_port.h"
#include "daemon/scheduler/tags.h"
#include "daemon/session/job_tokens.h"
#include "daemon/transport/integrity.h"

namespace railyard {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", why));
}

std::string TooLong(size_t got, size_t limit) {
  return absl::StrCat("is ", got, " bytes, more than ", limit);
}

}  // namespace

absl::Status CheckNodeName(absl::string_view name, absl::string_view field) {
  if (name.empty()) return Bad(field, "is empty");
  if (name.size() > kMaxNodeNameBytes) return Bad(field, TooLong(name.size(), kMaxNodeNameBytes));
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return Bad(field, absl::StrCat("has byte 0x", absl::Hex(c, absl::kZeroPad2), " at ", i,
                                     ": node names are printable ASCII without spaces"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckClaimedNode(const PeerIdentity& who, absl::string_view name,
                              absl::string_view field) {
  if (absl::Status s = CheckNodeName(name, field); !s.ok()) return s;
  if (absl::Status s = who.MayClaimNode(name); !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat(field, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckNodeInfo(const v1::NodeInfo& node, absl::string_view field,
                           bool address_required) {
  if (absl::Status s = CheckNodeName(node.node_name(), absl::StrCat(field, ".node_name"));
      !s.ok()) {
    return s;
  }
  if (address_required || !node.peer_address().empty()) {
    if (std::string why = HostPortProblem(node.peer_address()); !why.empty()) {
      return Bad(absl::StrCat(field, ".peer_address"),
                 absl::StrCat("'", node.peer_address().substr(0, 64), "' is not host:port: ", why));
    }
  }
  if (node.rail_addresses_size() > kMaxRailAddresses) {
    return Bad(absl::StrCat(field, ".rail_addresses"),
               absl::StrCat("has ", node.rail_addresses_size(), " entries, more than ",
                            kMaxRailAddresses));
  }
  for (int r = 0; r < node.rail_addresses_size(); ++r) {
    const size_t bytes = node.rail_addresses(r).size();
    if (bytes > kMaxRailAddressBytes) {
      return Bad(absl::StrCat(field, ".rail_addresses[", r, "]"),
                 TooLong(bytes, kMaxRailAddressBytes));
    }
  }
  if (node.has_tag_slot() && node.tag_slot() >= (1u << scheduler::tags::kSlotBits)) {
    return Bad(absl::StrCat(field, ".tag_slot"), absl::StrCat(node.tag_slot(), " does not fit ",
                                                              scheduler::tags::kSlotBits, " bits"));
  }
  if (node.paced_chunk_bytes() != 0 && (node.paced_chunk_bytes() < kMinPacedChunkBytes ||
                                        node.paced_chunk_bytes() > kMaxPacedChunkBytes)) {
    return Bad(absl::StrCat(field, ".paced_chunk_bytes"),
               absl::StrCat(node.paced_chunk_bytes(), " is neither 0 nor in [", kMinPacedChunkBytes,
                            ", ", kMaxPacedChunkBytes, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckIntegrity(absl::string_view value, absl::string_view field) {
  if (transport::ParseIntegrity(value).ok()) return absl::OkStatus();
  return Bad(field,
             absl::StrCat("'", value.substr(0, 32), "' is not one of \"\", \"none\", \"crc32c\""));
}

std::string StrongerIntegrity(absl::string_view a, absl::string_view b) {
  const absl::StatusOr<transport::Integrity> x = transport::ParseIntegrity(a);
  const absl::StatusOr<transport::Integrity> y = transport::ParseIntegrity(b);
  const transport::Integrity s = transport::Stronger(x.value_or(transport::Integrity::kNone),
                                                     y.value_or(transport::Integrity::kNone));
  return s == transport::Integrity::kNone ? "" : std::string(transport::IntegrityName(s));
}

absl::Status CheckJoinRequest(const PeerIdentity& who, const v1::JoinCommRequest& req,
                              absl::string_view coordinator) {
  if (!ValidJobId(req.job_id())) {
    return Bad("JoinCommRequest.job_id",
               absl::StrCat("'", req.job_id().substr(0, 64), "' is not [A-Za-z0-9._-]{1,128}"));
  }
  absl::StatusOr<CommId> id = ParseCommId(req.comm_id());
  if (!id.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("JoinCommRequest.comm_id: ", id.status().message()));
  }
  if (id->coordinator != coordinator) {
    return Bad("JoinCommRequest.comm_id", absl::StrCat("names coordinator ", id->coordinator,
                                                       ", not this daemon (", coordinator, ")"));
  }
  if (absl::Status s = CheckRankOf(req.rank(), req.nranks()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("JoinCommRequest.", s.message()));
  }
  if (absl::Status s = CheckNodeInfo(req.node(), "JoinCommRequest.node", !who.self); !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckClaimedNode(who, req.node().node_name(), "JoinCommRequest.node.node_name");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckIntegrity(req.integrity(), "JoinCommRequest.integrity"); !s.ok()) {
    return s;
  }
  if (who.self) return absl::OkStatus();
  return CheckDataPlaneVersion(req.node(), "JoinCommRequest.node.data_plane_version");
}

absl::Status CheckDataPlaneVersion(const v1::NodeInfo& node, absl::string_view field) {
  if (node.data_plane_version() == kDataPlaneVersion) return absl::OkStatus();
  const std::string theirs =
      node.data_plane_version() == 0
          ? std::string("no data-plane version (a railyardd from before versions were announced)")
          : absl::StrCat("data-plane version ", node.data_plane_version());
  return absl::FailedPreconditionError(
      absl::StrCat(field, ": node ", node.node_name().substr(0, 64), " speaks ", theirs,
                   ", this daemon ", kDataPlaneVersion,
                   "; every daemon of a communicator must speak the same one (finish the "
                   "rolling upgrade, or keep the job on nodes of one railyardd version)"));
}

absl::StatusOr<int> CheckLayoutFromCoordinator(const v1::JoinCommResponse& layout,
                                               const LayoutAsk& ask) {
  const std::string from =
      absl::StrCat("layout of communicator ", ask.comm_id, " from its coordinator: ");
  auto bad = [&](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(from, field, " ", why));
  };
  if (absl::Status s = CommBootstrap::CheckLayoutFits(layout, ask.comm_id); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(from, s.message()));
  }
  if (layout.node_of_rank_size() != ask.nranks) {
    return bad("JoinCommResponse.node_of_rank",
               absl::StrCat("has ", layout.node_of_rank_size(), " entries, rank ", ask.rank,
                            " asked for ", ask.nranks, " ranks"));
  }
  const bool multi = layout.nodes_size() > 1;
  int my_node = -1;
  for (int n = 0; n < layout.nodes_size(); ++n) {
    const v1::NodeInfo& node = layout.nodes(n);
    if (absl::Status s =
            CheckNodeInfo(node, absl::StrCat("JoinCommResponse.nodes[", n, "]"), multi);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(from, s.message()));
    }
    if (!ask.is_me(node)) continue;
    if (my_node >= 0) {
      return bad("JoinCommResponse.nodes",
                 absl::StrCat("list this daemon twice (", my_node, " and ", n, ")"));
    }
    my_node = n;
  }
  if (my_node < 0) return bad("JoinCommResponse.nodes", "do not list this daemon");
  // CheckLayoutFits put every rank on a listed node, and node_of_rank has nranks entries.
  if (layout.node_of_rank(ask.rank) != my_node) {
    return bad(absl::StrCat("JoinCommResponse.node_of_rank[", ask.rank, "]"),
               absl::StrCat("is node ", layout.node_of_rank(ask.rank), ", but rank ", ask.rank,
                            " is on this daemon (node ", my_node, ")"));
  }
  if (layout.rails() < 1 || layout.rails() > kMaxRailAddresses) {
    return bad("JoinCommResponse.rails",
               absl::StrCat(layout.rails(), " is not in [1, ", kMaxRailAddresses, "]"));
  }
  if (absl::Status s = CheckIntegrity(layout.integrity(), "JoinCommResponse.integrity"); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(from, s.message()));
  }
  if (multi && layout.data_secret() == 0) {
    return bad("JoinCommResponse.data_secret", "is 0 for a layout of more than one node");
  }
  const v1::CostModel& m = layout.cost_model();
  const std::pair<const char*, const std::string*> texts[] = {
      {"source", &m.source()},       {"op", &m.op()},
      {"algorithm", &m.algorithm()}, {"placement", &m.placement()},
      {"topology", &m.topology()},   {"fitted_at", &m.fitted_at()}};
  for (const auto& [name, text] : texts) {
    if (text->size() > kMaxCostModelTextBytes) {
      return bad(absl::StrCat("JoinCommResponse.cost_model.", name),
                 TooLong(text->size(), kMaxCostModelTextBytes));
    }
  }
  if (multi) {
    for (int n = 0; n < layout.nodes_size(); ++n) {
      if (absl::Status s = CheckDataPlaneVersion(
              layout.nodes(n), absl::StrCat("JoinCommResponse.nodes[", n, "].data_plane_version"));
          !s.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(from, s.message()));
      }
    }
  }
  return my_node;
}

}  // namespace railyard
