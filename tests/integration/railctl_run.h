// Runs the built railctl (RAILCTL_PATH) as a shell line, stdout and stderr captured apart,
// bounded by a deadline: shared by the railctl integration tests.
#pragma once

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/integration/process.h"

namespace railyard::testing {

struct RailctlRun {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// railctl with args (a shell line: may start with "printf ... |") and stdin_text on its stdin;
// its files go in dir.
inline RailctlRun Railctl(const std::string& dir, const std::string& args,
                          const std::string& stdin_text = "") {
  const std::string out = dir + "/railctl.out";
  const std::string err = dir + "/railctl.err";
  const std::string in = dir + "/railctl.in";
  std::ofstream(in) << stdin_text;
  Process p({"/bin/sh", "-c",
             std::string(RAILCTL_PATH) + " " + args + " <" + in + " >" + out + " 2>" + err},
            dir + "/sh.log");
  RailctlRun r;
  r.code = p.Wait(std::chrono::seconds(20)).value_or(-1);
  r.out = Slurp(out);
  r.err = Slurp(err);
  return r;
}

}  // namespace railyard::testing
