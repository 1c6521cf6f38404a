// `railctl token`: signed job tokens (daemon/auth/signed_token.h, docs/tokens.md) without a
// daemon.
//   railctl token keygen [--out FILE]
//   railctl token issue --job J --ttl DURATION --key FILE
//   railctl token verify --job J --key FILE TOKEN|-
// keygen prints (or writes to a new mode-0600 FILE) a random 32-byte key as 64 hex digits; issue
// prints job J's token valid for DURATION, signed with FILE's first key; verify exits 0 saying
// until when the token is valid, or 1 saying why not. Usage errors exit 2.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace railyard::railctl {

absl::Status RunToken(const std::vector<std::string>& args);

}  // namespace railyard::railctl
