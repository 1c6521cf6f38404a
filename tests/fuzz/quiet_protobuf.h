// Protobuf logs every string with invalid UTF-8 it refuses while parsing, and fuzz inputs are
// full of them: the targets that parse protos include this to drop those logs (a refused parse
// is still an error the target sees).
#pragma once

#include "google/protobuf/stubs/logging.h"

namespace railyard::fuzz {

inline const bool kProtobufLogsOff = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

}  // namespace railyard::fuzz
