#include "daemon/transport/ucx/ucx_components.h"

#include <ucs/type/status.h>
#include <uct/api/uct.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace railyard::transport {

absl::StatusOr<std::vector<std::string>> UcxComponents() {
  uct_component_h* components = nullptr;
  unsigned count = 0;
  if (ucs_status_t s = uct_query_components(&components, &count); s != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("uct_query_components: ", ucs_status_string(s)));
  }
  std::vector<std::string> names;
  for (unsigned i = 0; i < count; ++i) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
    if (uct_component_query(components[i], &attr) == UCS_OK) names.emplace_back(attr.name);
  }
  uct_release_component_list(components);
  return names;
}

std::vector<std::string> CudaTransports(const std::vector<std::string>& components) {
  std::vector<std::string> out;
  for (const std::string& c : components) {
    if (absl::StrContains(c, "cuda") || absl::StrContains(c, "gdr")) out.push_back(c);
  }
  return out;
}

}  // namespace railyard::transport
