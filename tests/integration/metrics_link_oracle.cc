// The exact per-link byte counts of one collective, for the metrics integration test: the same
// Generate()d schedule the daemons run, executed by the symbolic executor, which counts the bytes
// of every inter-node (src node, dst node, rail) link. Prints one JSON object:
//   {"algorithm": "ring", "cross_rail_bytes": 0,
//    "links": [{"src": 0, "dst": 1, "rail": 1, "bytes": 1572864, "messages": 6}, ...]}
// Usage: metrics-link-oracle OP ALGO NODES RANKS_PER_NODE RAILS COUNT DTYPE [CHUNK_BYTES]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "daemon/kernels/types.h"
#include "daemon/scheduler/op.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/scheduler/symbolic_executor.h"

namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr, "metrics-link-oracle: %s\n", why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace railyard;  // NOLINT(google-build-using-namespace): a 60-line tool
  if (argc < 8 || argc > 9) {
    return Fail("usage: OP ALGO NODES RANKS_PER_NODE RAILS COUNT DTYPE [CHUNK_BYTES]");
  }
  scheduler::OpShape shape;
  if (!scheduler::ParseOpName(argv[1], &shape.op)) return Fail("unknown op");
  const std::string algo = argv[2];
  int nodes = 0, per_node = 0, rails = 0;
  uint64_t chunk = 256 * 1024;
  if (!absl::SimpleAtoi(argv[3], &nodes) || !absl::SimpleAtoi(argv[4], &per_node) ||
      !absl::SimpleAtoi(argv[5], &rails) || !absl::SimpleAtoi(argv[6], &shape.count) || nodes < 1 ||
      per_node < 1 || rails < 1) {
    return Fail("NODES, RANKS_PER_NODE, RAILS and COUNT must be positive integers");
  }
  if (!kernels::ParseDataType(argv[7], &shape.dtype)) return Fail("unknown dtype");
  if (argc == 9 && !absl::SimpleAtoi(argv[8], &chunk)) return Fail("bad CHUNK_BYTES");
  const scheduler::CommLayout layout = scheduler::CommLayout::Uniform(nodes, per_node, rails);
  absl::StatusOr<scheduler::RankSchedule> schedule =
      scheduler::Generate(algo, shape, layout, chunk);
  if (!schedule.ok()) return Fail(std::string(schedule.status().message()));
  scheduler::SimMemory memory =
      scheduler::SimMemory::ForOp(shape, layout.nranks, /*in_place=*/false, std::byte{1});
  scheduler::SimOptions options;
  options.check_races = false;  // only the counts matter here
  absl::StatusOr<scheduler::SimStats> stats =
      scheduler::RunSymbolic(*schedule, layout, shape, &memory, options);
  if (!stats.ok()) return Fail(std::string(stats.status().message()));
  std::printf("{\"algorithm\": \"%s\", \"cross_rail_bytes\": %llu, \"links\": [",
              schedule->algorithm.empty() ? algo.c_str() : schedule->algorithm.c_str(),
              static_cast<unsigned long long>(stats->cross_rail_bytes));
  bool first = true;
  for (const auto& [key, link] : stats->links) {
    std::printf("%s{\"src\": %d, \"dst\": %d, \"rail\": %d, \"bytes\": %llu, \"messages\": %llu}",
                first ? "" : ", ", key.src_node, key.dst_node, key.rail,
                static_cast<unsigned long long>(link.bytes),
                static_cast<unsigned long long>(link.messages));
    first = false;
  }
  std::printf("]}\n");
  return 0;
}
