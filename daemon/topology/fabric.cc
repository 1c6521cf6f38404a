#include "daemon/topology/fabric.h"

namespace railyard::topology {

const char* FabricKindName(FabricKind kind) {
  switch (kind) {
    case FabricKind::kFlat:
      return "flat";
    case FabricKind::kTwoTier:
      return "two_tier";
    case FabricKind::kRailOptimized:
      return "rail_optimized";
    case FabricKind::kThreeTier:
      return "three_tier";
    case FabricKind::kTorus:
      return "torus";
  }
  return "unknown";
}

bool ParseFabricKind(const std::string& name, FabricKind* kind) {
  std::string n = name;
  for (char& c : n) {
    if (c == '-') c = '_';
  }
  for (FabricKind k : {FabricKind::kFlat, FabricKind::kTwoTier, FabricKind::kRailOptimized,
                       FabricKind::kThreeTier, FabricKind::kTorus}) {
    if (n == FabricKindName(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

}  // namespace railyard::topology
