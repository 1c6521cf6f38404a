#include "tools/railctl/flag_set.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/topology/units.h"

namespace railyard::railctl {

absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args,
                                       const std::set<std::string>& value_flags,
                                       const std::set<std::string>& bool_flags) {
  ParsedFlags out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    // Single-letter flags as nccl-tests spell them: -b 64K is --b 64K.
    if (arg.size() == 2 && arg[0] == '-' && arg[1] != '-' && arg[1] != 'h' &&
        value_flags.count(arg.substr(1)) != 0) {
      arg = "-" + arg;
    }
    if (arg.size() < 2 || arg.compare(0, 2, "--") != 0 || arg == "--") {
      if (arg == "-h") {
        out.bools.insert("help");
        continue;
      }
      out.positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (name == "help") {
      out.bools.insert("help");
    } else if (bool_flags.count(name) != 0) {
      if (has_value) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      out.bools.insert(name);
    } else if (value_flags.count(name) != 0) {
      if (!has_value) {
        if (i + 1 >= args.size()) {
          return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        }
        value = args[++i];
      }
      out.values[name] = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '--", name, "'"));
    }
  }
  return out;
}

absl::StatusOr<int> IntFlag(const ParsedFlags& flags, const std::string& name, int fallback,
                            int min_value) {
  if (!flags.Has(name)) return fallback;
  int v = 0;
  if (!absl::SimpleAtoi(flags.Get(name), &v) || v < min_value) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be an integer >= ", min_value,
                                                   " (got '", flags.Get(name), "')"));
  }
  return v;
}

namespace {

absl::StatusOr<double> UnitFlag(const ParsedFlags& flags, const std::string& name, double fallback,
                                absl::StatusOr<double> (*parse)(absl::string_view)) {
  if (!flags.Has(name)) return fallback;
  absl::StatusOr<double> v = parse(flags.Get(name));
  if (!v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", v.status().message()));
  }
  return *v;
}

}  // namespace

absl::StatusOr<double> DurationFlag(const ParsedFlags& flags, const std::string& name,
                                    double fallback) {
  return UnitFlag(flags, name, fallback, &topology::ParseDuration);
}

absl::StatusOr<double> BandwidthFlag(const ParsedFlags& flags, const std::string& name,
                                     double fallback) {
  return UnitFlag(flags, name, fallback, &topology::ParseBandwidth);
}

absl::StatusOr<double> BytesFlag(const ParsedFlags& flags, const std::string& name,
                                 double fallback) {
  return UnitFlag(flags, name, fallback, &topology::ParseBytes);
}

}  // namespace railyard::railctl
