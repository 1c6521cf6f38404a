// Element types and reduction operators as the kernels see them: the API's own
// (common/include/railyard/types.h, shared with the client and the tools), under kernels::.
#pragma once

#include "railyard/types.h"

namespace railyard::kernels {

using ::railyard::DataType;
using ::railyard::ElementSize;
using ::railyard::kNumDataTypes;
using ::railyard::kNumRedOps;
using ::railyard::Name;
using ::railyard::ParseDataType;
using ::railyard::ParseRedOp;
using ::railyard::RedOp;

}  // namespace railyard::kernels
