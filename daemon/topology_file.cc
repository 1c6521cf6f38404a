#include "daemon/topology_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace railyard {

absl::StatusOr<v1::NodeTopology> ParseNodeTopology(const std::string& json) {
  v1::NodeTopology topo;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(json, &topo, opts);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology JSON: ", std::string(status.message().data(), status.message().size())));
  }
  if (topo.rails_size() == 0) {
    return absl::InvalidArgumentError("topology declares no rails (\"rails\": [...] is required)");
  }
  if (topo.rails_size() > 64) {
    return absl::InvalidArgumentError("topology declares more than 64 rails");
  }
  for (int i = 0; i < topo.rails_size(); ++i) {
    if (topo.rails(i).name().empty()) topo.mutable_rails(i)->set_name(absl::StrCat("rail", i));
  }
  return topo;
}

absl::StatusOr<v1::NodeTopology> LoadNodeTopology(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read topology file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto topo = ParseNodeTopology(ss.str());
  if (!topo.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", topo.status().message()));
  }
  return topo;
}

v1::NodeTopology DefaultNodeTopology() {
  v1::NodeTopology topo;
  auto* rail = topo.add_rails();
  rail->set_name("rail0");
  return topo;
}

}  // namespace railyard
