// A small parser for railctl subcommands' flags: `--name value`, `--name=value`, boolean
// `--name`, single-letter value flags as `-b value`, and positional arguments. Unknown flags and
// missing values are INVALID_ARGUMENT naming the flag.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace railyard::railctl {

struct ParsedFlags {
  std::map<std::string, std::string> values;  // without the leading "--"
  std::set<std::string> bools;
  std::vector<std::string> positional;

  bool Has(const std::string& name) const { return values.count(name) != 0; }
  bool Bool(const std::string& name) const { return bools.count(name) != 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
};

// value_flags take a value; bool_flags do not. Names without "--".
absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args,
                                       const std::set<std::string>& value_flags,
                                       const std::set<std::string>& bool_flags);

// Flags with units (daemon/topology/units.h): fallback when absent, INVALID_ARGUMENT naming the
// flag when the text does not parse.
absl::StatusOr<double> DurationFlag(const ParsedFlags& flags, const std::string& name,
                                    double fallback);
absl::StatusOr<double> BandwidthFlag(const ParsedFlags& flags, const std::string& name,
                                     double fallback);
absl::StatusOr<double> BytesFlag(const ParsedFlags& flags, const std::string& name,
                                 double fallback);

// An integer flag >= min_value; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<int> IntFlag(const ParsedFlags& flags, const std::string& name, int fallback,
                            int min_value);

}  // namespace railyard::railctl
