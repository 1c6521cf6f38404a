#include "daemon/scheduler/sim/jobs_file.h"

#include <cmath>
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/topology/units.h"

namespace railyard::scheduler::sim {
namespace {

using nlohmann::json;

absl::StatusOr<double> SizeOf(const json& v, const std::string& what) {
  if (v.is_number()) {
    const double b = v.get<double>();
    if (!(b >= 0)) return absl::InvalidArgumentError(absl::StrCat(what, " must be >= 0"));
    return b;
  }
  if (!v.is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a size string or a number"));
  }
  absl::StatusOr<double> b = topology::ParseBytes(v.get<std::string>());
  if (!b.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", b.status().message()));
  return *b;
}

absl::StatusOr<int> IntOf(const json& v, const std::string& what) {
  if (!v.is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be an integer"));
  }
  const auto x = v.get<int64_t>();
  if (x < 0 || x > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", x, " out of range"));
  }
  return static_cast<int>(x);
}

absl::StatusOr<JobSpec> ParseJob(const json& j, size_t index, const topology::FabricSpec& fabric) {
  JobSpec job;
  job.name = absl::StrCat("job", index);
  if (j.contains("name")) {
    if (!j["name"].is_string()) return absl::InvalidArgumentError("name must be a string");
    job.name = j["name"].get<std::string>();
  }
  static const std::set<std::string> kKeys = {"name",  "op",         "size",      "algo",
                                              "nodes", "first_node", "num_nodes", "ranks_per_node",
                                              "chunk", "root"};
  for (const auto& [key, value] : j.items()) {
    if (kKeys.count(key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("unknown key '", key, "'"));
    }
  }
  if (!j.contains("op") || !j["op"].is_string()) {
    return absl::InvalidArgumentError("needs \"op\" (e.g. \"allreduce\")");
  }
  const std::string op = j["op"].get<std::string>();
  if (!ParseOpName(op, &job.shape.op) || IsPointToPoint(job.shape.op) ||
      job.shape.op == OpKind::kAllToAllv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "op '", op,
        "' is not one of allreduce, reducescatter, allgather, broadcast, reduce, alltoall, "
        "barrier"));
  }
  if (j.contains("algo")) {
    if (!j["algo"].is_string()) return absl::InvalidArgumentError("algo must be a string");
    job.algorithm = j["algo"].get<std::string>();
  }
  if (j.contains("ranks_per_node")) {
    auto g = IntOf(j["ranks_per_node"], "ranks_per_node");
    if (!g.ok()) return g.status();
    if (*g < 1 || *g > fabric.ranks_per_node) {
      return absl::InvalidArgumentError(
          absl::StrCat("ranks_per_node ", *g, " not in [1, ", fabric.ranks_per_node, "]"));
    }
    job.ranks_per_node = *g;
  }
  if (j.contains("nodes")) {
    if (j.contains("first_node") || j.contains("num_nodes")) {
      return absl::InvalidArgumentError("give either nodes or first_node/num_nodes, not both");
    }
    if (!j["nodes"].is_array() || j["nodes"].empty()) {
      return absl::InvalidArgumentError("nodes must be a non-empty array of node indices");
    }
    for (const json& n : j["nodes"]) {
      auto node = IntOf(n, "node");
      if (!node.ok()) return node.status();
      job.nodes.push_back(*node);
    }
  } else if (j.contains("first_node") || j.contains("num_nodes")) {
    int first = 0, num = 0;
    if (j.contains("first_node")) {
      auto f = IntOf(j["first_node"], "first_node");
      if (!f.ok()) return f.status();
      first = *f;
    }
    num = fabric.nodes - first;
    if (j.contains("num_nodes")) {
      auto k = IntOf(j["num_nodes"], "num_nodes");
      if (!k.ok()) return k.status();
      num = *k;
    }
    if (num < 1 || first + num > fabric.nodes) {
      return absl::InvalidArgumentError(absl::StrCat("nodes [", first, ", ", first + num,
                                                     ") not within the fabric's ", fabric.nodes,
                                                     " nodes"));
    }
    for (int k = 0; k < num; ++k) job.nodes.push_back(first + k);
  }
  for (int node : job.nodes) {
    if (node >= fabric.nodes) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", node, " not in the fabric's [0, ", fabric.nodes, ")"));
    }
  }
  if (j.contains("chunk")) {
    auto c = SizeOf(j["chunk"], "chunk");
    if (!c.ok()) return c.status();
    job.chunk_bytes = static_cast<size_t>(*c);
  }
  if (j.contains("root")) {
    auto r = IntOf(j["root"], "root");
    if (!r.ok()) return r.status();
    job.shape.root = *r;
  }
  double bytes = 0;
  if (j.contains("size")) {
    auto b = SizeOf(j["size"], "size");
    if (!b.ok()) return b.status();
    bytes = *b;
  } else if (job.shape.op != OpKind::kBarrier) {
    return absl::InvalidArgumentError("needs \"size\" (bytes per rank, e.g. \"256MB\")");
  }
  const int k = job.nodes.empty() ? fabric.nodes : static_cast<int>(job.nodes.size());
  const int g = job.ranks_per_node == 0 ? fabric.ranks_per_node : job.ranks_per_node;
  job.shape.dtype = kernels::DataType::kFloat32;
  job.shape.count = CountForBytes(job.shape.op, bytes, k * g);
  return job;
}

}  // namespace

uint64_t CountForBytes(OpKind op, double bytes, int nranks) {
  return CountForMessageBytes(op, kernels::DataType::kFloat32, bytes, nranks);
}

absl::StatusOr<std::vector<JobSpec>> ParseJobsJson(const std::string& text,
                                                   const topology::FabricSpec& fabric) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("jobs file is not valid JSON: ", e.what()));
  }
  if (!doc.is_object() || !doc.contains("jobs") || !doc["jobs"].is_array() || doc["jobs"].empty()) {
    return absl::InvalidArgumentError(
        "jobs file needs {\"jobs\": [{\"op\": ..., \"size\": ...}, ...]} with at least one job");
  }
  std::vector<JobSpec> jobs;
  for (size_t i = 0; i < doc["jobs"].size(); ++i) {
    const json& j = doc["jobs"][i];
    if (!j.is_object())
      return absl::InvalidArgumentError(absl::StrCat("job ", i, " not an object"));
    absl::StatusOr<JobSpec> job = ParseJob(j, i, fabric);
    if (!job.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("jobs file, job ", i, ": ", job.status().message()));
    }
    jobs.push_back(std::move(*job));
  }
  return jobs;
}

}  // namespace railyard::scheduler::sim
