// systemd's readiness protocol without libsystemd: a datagram to $NOTIFY_SOCKET (sd_notify(3)).
// Does nothing where the variable is unset (not started by systemd with Type=notify).
#pragma once

#include <string>

namespace railyard {

// Sends `state` ("READY=1", "MAINPID=<pid>\nREADY=1", "STOPPING=1"); false when it could not
// (logged by the caller if it matters). True and nothing sent without $NOTIFY_SOCKET.
bool SdNotify(const std::string& state);

}  // namespace railyard
