// What the library keeps per process: the one railyard client (connected on first use, from
// RAILYARD_SOCKET, RAILYARD_JOB and RAILYARD_TOKEN), the NCCL_* settings it honours, the last
// error (ncclGetLastError) and NCCL_DEBUG's log.
#pragma once

#include <nccl.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "railyard/client.h"

namespace railyard::nccl {

// The process's client; connects on the first call (and again after a failed connect).
absl::StatusOr<Client*> ProcessClient();

// NCCL_ALGO as an algorithm railyard has ("ring", "tree"; case-insensitive), else empty (another
// value is logged once under NCCL_DEBUG=WARN and left to the daemon's tuner).
const std::string& ForcedAlgorithm();

// Records why a call failed (ncclGetLastError, and NCCL_DEBUG=WARN's log) and returns r.
ncclResult_t Fail(ncclResult_t r, const std::string& why);
// The calling thread's last failure ("" if none).
const char* LastError();

enum class DebugLevel { kNone, kVersion, kWarn, kInfo, kTrace };
DebugLevel Debug();
// One NCCL_DEBUG line: "<host>:<pid>:<tid> [<rank>] NCCL <LEVEL> <message>" on stderr.
void Log(DebugLevel level, int rank, const std::string& message);
// NCCL_DEBUG=VERSION (and above) prints the version once per process, as NCCL does at init.
void LogVersionOnce();

}  // namespace railyard::nccl
