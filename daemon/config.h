// Everything railyardd is configured with. main() turns flags (and RAILYARD_<FLAG> env) into this.
#pragma once

#include <cstddef>
#include <string>

#include "absl/time/time.h"

namespace railyard {

struct DaemonConfig {
  // Unix socket serving the local (client) and admin APIs; created with mode 0660.
  std::string socket = "/run/railyard/railyard.sock";
  // This node's name in comm ids, logs and status. Empty: the host name.
  std::string node_name;
  // host:port of the daemon<->daemon service; named as coordinator in comm ids when set. Port 0
  // picks a free port (reported in logs and status).
  std::string peer_listen;
  // host:port of the Prometheus endpoint (/metrics, /healthz, /readyz); empty: none. Port 0 picks
  // a free port (logged).
  std::string metrics_listen;
  // JSON file describing this node's rails (docs/topology.md); empty: one rail, UCX's choice.
  std::string topology_file;
  // Algorithm for requests that force none (a name of the algorithm table, or "local" on one
  // node), where it implements the op; empty: the communicator's tuner (cost model) chooses.
  std::string algo;
  // A peer daemon that has not answered heartbeats for this long fails its communicators.
  absl::Duration peer_timeout = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // File of "job_id token" lines. When set, only these jobs may connect, with these tokens;
  // when empty, the first session of a job sets its token.
  std::string job_tokens_file;
  // Threads executing collectives. 0: one per CPU.
  int worker_threads = 0;
  // Default wait for the other ranks' matching submission of a collective.
  absl::Duration op_timeout = absl::Seconds(300);
  // Default wait for all ranks to join a communicator.
  absl::Duration init_timeout = absl::Seconds(120);
  // Size of one step of a local plan (daemon/scheduler/local_plan.h), and the chunk size of a
  // forced algorithm's schedule (the tuner picks its own around it).
  size_t chunk_bytes = 256 * 1024;
  // How long shutdown waits for RPCs in flight before cancelling them.
  absl::Duration shutdown_grace = absl::Seconds(2);
  // Persistent state: calibration.json (the cost model's fitted link classes).
  std::string state_dir = "/var/lib/railyard";
};

}  // namespace railyard
