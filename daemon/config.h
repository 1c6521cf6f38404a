// Everything railyardd is configured with. main() turns flags (and RAILYARD_<FLAG> env) into this.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/session/quota.h"
#include "daemon/transport/tcp_congestion.h"

namespace railyard {

struct DaemonConfig {
  // Unix socket serving the local (client) API; created with mode 0660. Beside it, "<socket>.fd"
  // is the side channel clients pass buffer descriptors over (FdSocketPath).
  std::string socket = "/run/railyard/railyard.sock";
  // This node's name in comm ids, logs and status. Empty: the host name.
  std::string node_name;
  // host:port of the daemon<->daemon service; named as coordinator in comm ids when set. Port 0
  // picks a free port (reported in logs and status).
  std::string peer_listen;
  // The peer service's mutual TLS (PEM files): this daemon's certificate (it must name
  // node_name in a DNS subjectAltName), its key, and the cluster CA every peer must chain to.
  // With peer_listen set, all three are required unless peer_insecure (ConfigFromFlags).
  std::string peer_tls_cert;
  std::string peer_tls_key;
  std::string peer_tls_ca;
  // Plaintext, unauthenticated peer plane (loopback demos only); excludes the peer_tls_* files.
  bool peer_insecure = false;
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
  absl::Duration rail_stall_timeout = absl::Seconds(60);  // 0: never
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Socket serving the Admin API (railctl), created mode 0600; never the client socket. Empty:
  // "<socket>.admin" (AdminSocketPath). Where tenants may be root in their own mount namespace
  // (containers), put it in a directory they do not mount.
  std::string admin_socket;
  // File of "job_id token" lines: these jobs may connect with these tokens.
  std::string job_tokens_file;
  // File of HMAC keys (hex, one per line): signed job tokens (railctl token issue) verify with any.
  std::string token_key_file;
  // Without a key or tokens file, lets the first session of a job set its token (demos only).
  bool insecure_first_session_token = false;
  // File of per-job peer credential policies ("<job|*> uids=A,B gids=C"); empty: any uid.
  std::string job_policy_file;
  // File of "job_id weight" lines: jobs' weights on the paced rails' fair queues (reloaded on
  // SIGHUP); empty: every job weighs 1 unless set through Admin.
  std::string job_weights_file;
  // What one session, one job and the whole daemon may hold (--max_* flags).
  QuotaLimits quotas = QuotaLimits::Defaults();
  // Threads executing collectives. 0: one per CPU the daemon may run on (its affinity mask).
  int worker_threads = 0;
  // CPUs the whole daemon is pinned to at start-up (--cpus; main applies it before any thread
  // starts, PinProcessToCpus). Empty: not pinned.
  std::vector<int> cpus;
  // Default wait for the other ranks' matching submission of a collective.
  absl::Duration op_timeout = absl::Seconds(300);
  // Default wait for all ranks to join a communicator.
  absl::Duration init_timeout = absl::Seconds(120);
  // The longest any join waits for the other ranks, here and at the coordinator, whatever the
  // request asks for (a request may ask for less): a bootstrap's state expires after it.
  absl::Duration join_timeout = absl::Seconds(120);
  // Communicator bootstraps this daemon coordinates that may wait for ranks at once.
  size_t max_pending_joins = 1024;
  // Of those, how many one job may hold (0: no share).
  size_t max_pending_joins_per_job = 64;
  // How much nicer than the process its data-plane threads run (util/thread_name.h).
  int data_plane_nice = 5;
  // Mappings of clients' host buffers and rings, in all and per job (0: derived from
  // vm.max_map_count: mapping_budget.h).
  size_t max_mappings = 0;
  size_t max_mappings_per_job = 0;
  // Operations held waiting for their streams, per session and per job.
  size_t max_held_ops_per_session = 8192;
  size_t max_held_ops_per_job = 16384;
  // Connections the client socket serves, in all and per uid (0: no share).
  size_t max_client_connections = 4096;
  size_t max_client_connections_per_uid = 512;
  // Side-channel connections waiting for their Connect, in all and per uid (0: no share).
  size_t max_unbound_side_channels = 256;
  size_t max_unbound_side_channels_per_uid = 32;
  // Size of one step of a local plan (daemon/scheduler/local_plan.h), and the chunk size of a
  // forced algorithm's schedule (the tuner picks its own around it).
  size_t chunk_bytes = 256 * 1024;
  // How long a session's ring thread spins after its last submission before it sleeps on the
  // doorbell (--spin_us): the price of a fast next operation is this much CPU after each one.
  absl::Duration spin = absl::Microseconds(10);
  // On a multi-node daemon, while a session has operations in flight its ring thread keeps
  // polling (the ring and the UCX rails, running their transfers itself) until this long after
  // its last submission or completion (--poll_us), instead of sleeping after `spin` and leaving
  // the transfers to the rails' progress threads. Also the cap of the idle spin, which grows
  // past `spin` to twice the time the session's client takes to submit again after a
  // completion (SessionRings). CPU only while operations are in flight or just after.
  absl::Duration poll = absl::Microseconds(200);
  // Which sessions share a ring thread (--ring_threads; RingPollers): those of one job (false),
  // or none (true).
  bool ring_thread_per_session = false;
  // The longest sleep between looks at the ready words of operations held for their streams
  // (--stream_poll_us; StreamGates): the most such an operation starts late.
  absl::Duration stream_poll = absl::Microseconds(100);
  // Idle page-locked staging buffers kept for reuse (--staging_cache_bytes; device::StagingPool).
  uint64_t staging_cache_bytes = uint64_t{512} << 20;
  // Device memory staged across nodes: an operation whose copy to host memory is larger goes to
  // the device's thread for it, in the order its rank submitted, instead of copying on the
  // submitting thread (--staging_inline_bytes; SubmitPath::MustHold).
  uint64_t staging_inline_bytes = uint64_t{1} << 20;
  // The most a staging copy moves per task of a device's thread before the device's other queued
  // work runs (--staging_chunk_bytes; device_staging.h). At least 4096.
  uint64_t staging_chunk_bytes = uint64_t{4} << 20;
  // A collective staged on the device's thread starts once its host memory is leased, its steps
  // waiting for the chunks they touch (--staging_pipeline; SubmitPath::StageOnDevice).
  bool staging_pipeline = true;
  // Accept legacy CUDA IPC handles for device memory (--cuda_ipc; SessionPlane::RegisterBuffer).
  bool cuda_ipc = false;
  // Collectives on one node moving at most this many bytes run on the thread that made them
  // complete (the last rank's submission), without waking the worker pool (--inline_max_bytes).
  size_t inline_max_bytes = 64 * 1024;
  // Testing only (--fake_gpus): this many fake devices instead of CUDA's.
  int fake_gpus = 0;
  // After each burst of inter-node traffic a UCX rail's progress thread keeps polling this long
  // before it sleeps (transport::UcxTransport::Options::busy_poll). 0: sleep at once.
  absl::Duration ucx_busy_poll = absl::ZeroDuration();
  transport::TcpCongestionPolicy rail_tcp_congestion;  // --rail_tcp_congestion
  // How long shutdown waits for RPCs in flight before cancelling them.
  absl::Duration shutdown_grace = absl::Seconds(2);
  // Take the node over from the railyardd serving --socket (docs/restarts.md): its listening
  // sockets come over "<socket>.handover"; it hands its sessions over and exits.
  bool takeover = false;
  // Take over when a railyardd serves --socket, else start as usual (a DaemonSet pod: the first
  // on its node starts, a newer one beside it takes over).
  bool takeover_if_serving = false;
  // After handing over: exit (systemd, a shell), or stay idle until SIGTERM (a pod replaced by a
  // RollingUpdate: a container that exits is restarted by the kubelet).
  bool exit_after_handover = true;
  // SIGTERM/SIGINT: hand the sessions back to their clients as a handover does, for the next
  // daemon (--on_stop=drain), instead of cancelling what is pending (cancel).
  bool drain_on_stop = true;
  // How long a takeover may take to start serving: the new daemon's wait for the old one's
  // answers, and the old one's wait for the new one's Ready.
  absl::Duration takeover_timeout = absl::Seconds(60);
  // How long a daemon handing over lets the collectives its ranks all submitted finish before it
  // ends the sessions anyway.
  absl::Duration handover_drain = absl::Seconds(30);
  // Persistent state: calibration.json (the cost model's fitted link classes).
  std::string state_dir = "/var/lib/railyard";
  // What this daemon asks for on the wire of its communicators' inter-node transfers: "none" or
  // "crc32c" (daemon/transport/framed_endpoint.h). A rank may ask for more, never for less.
  std::string integrity = "none";
  // TEST ONLY (--test_flip_bit_every): flip one bit in every Nth message sent to another daemon
  // (daemon/transport/bit_flip_endpoint.h). 0: off, as it must be in production.
  uint64_t test_flip_bit_every = 0;
  // BENCHMARKS ONLY (--test_frame_split_min_bytes): FramedEndpoint::Options::split_min_bytes
  // (daemon/transport/framed_endpoint.h), part of the wire format: every daemon of a communicator
  // must run with the same value. -1: the default.
  int64_t test_frame_split_min_bytes = -1;
};

}  // namespace railyard
