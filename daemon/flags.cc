#include "daemon/flags.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/comm/peer_input.h"
#include "daemon/scheduler/algorithms/algorithms.h"
#include "daemon/session/mapping_budget.h"
#include "daemon/topology/cpu_affinity.h"
#include "daemon/transport/tcp_congestion.h"
#include "daemon/util/log.h"

ABSL_FLAG(std::string, socket, "/run/railyard/railyard.sock",
          "Unix socket of the local (client) gRPC API, created with mode 0660; buffer descriptors "
          "travel over <socket>.fd beside it");
ABSL_FLAG(std::string, admin_socket, "",
          "Unix socket of the Admin API (railctl), created mode 0600 (default: <socket>.admin); "
          "keep it out of tenants' mounts");
ABSL_FLAG(std::string, node_name, "",
          "This node's name in comm ids, logs and status (default: host name)");
ABSL_FLAG(std::string, peer_listen, "",
          "host:port of the daemon-to-daemon service; named as coordinator in comm ids when set");
ABSL_FLAG(std::string, peer_tls_cert, "",
          "PEM certificate of this daemon for the peer service's mutual TLS, signed by "
          "--peer_tls_ca and naming --node_name in a DNS subjectAltName");
ABSL_FLAG(std::string, peer_tls_key, "", "PEM private key of --peer_tls_cert");
ABSL_FLAG(std::string, peer_tls_ca, "",
          "PEM cluster CA: every peer daemon (server and client) must present a certificate it "
          "signed");
ABSL_FLAG(bool, peer_insecure, false,
          "Serve and call the peer service in plaintext with no authentication instead of "
          "--peer_tls_* (anyone who reaches the port can act as a daemon: loopback demos only)");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port serving Prometheus /metrics, /healthz and /readyz (port 0: a free port; "
          "empty: off)");
ABSL_FLAG(std::string, topology, "",
          "JSON file describing this node's rails (docs/topology.md); default: one rail");
ABSL_FLAG(std::string, algo, "",
          "Default algorithm when a request forces none: local (one node), ring, tree, rhd, "
          "direct, hier, torus; empty: the tuner's choice");
ABSL_FLAG(absl::Duration, peer_timeout, absl::Seconds(10),
          "A peer daemon silent this long fails the communicators it shares with this one");
ABSL_FLAG(absl::Duration, rail_stall_timeout, absl::Seconds(60),
          "A running operation waiting on a rail that delivered nothing from a peer this long, "
          "while the peer confirms it sent, fails with UNAVAILABLE naming the rail (a link down); "
          "shorter outages only pause it (TCP resends once the link is back); 0: never (the "
          "operation waits for --op_timeout)");
ABSL_FLAG(std::string, job_tokens, "",
          "File of 'job_id token' lines: these jobs may connect with these tokens");
ABSL_FLAG(std::string, token_key_file, "",
          "File of hex HMAC-SHA256 keys, one per line: jobs connect with tokens signed by any "
          "(railctl token issue); the first line is the one railctl signs with");
ABSL_FLAG(bool, insecure_first_session_token, false,
          "Without --token_key_file or --job_tokens, let the first session of a job set its token "
          "(any local process can claim any job id first: demos only)");
ABSL_FLAG(std::string, job_policy, "",
          "File of '<job|*> uids=A,B gids=C' lines: which peer uids/gids may connect as a job");
ABSL_FLAG(std::string, job_weights, "",
          "File of 'job_id weight' lines: each job's weight on the paced rails' fair queues "
          "(0.01..1000, default 1), reloaded on SIGHUP (docs/fair-share.md)");
ABSL_FLAG(uint64_t, max_sessions, 1024, "Sessions the daemon serves at once (0: no limit)");
ABSL_FLAG(uint64_t, max_sessions_per_job, 256, "Sessions of one job at once (0: no limit)");
ABSL_FLAG(
    uint64_t, max_metric_jobs, 64,
    "Jobs with their own metric series; later jobs are summed as job=\"other\" (0: no limit)");
ABSL_FLAG(uint64_t, max_buffers_per_session, 4096, "Registered buffers per session (0: no limit)");
ABSL_FLAG(uint64_t, max_buffers_per_job, 16384, "Registered buffers per job (0: no limit)");
ABSL_FLAG(uint64_t, max_buffer_bytes_per_session, uint64_t{256} << 30,
          "Bytes of registered buffers per session (0: no limit); unless given, at most 1/8 of "
          "the node's memory (MemTotal)");
ABSL_FLAG(uint64_t, max_buffer_bytes_per_job, uint64_t{1024} << 30,
          "Bytes of registered buffers per job (0: no limit); unless given, at most 1/4 of the "
          "node's memory (MemTotal)");
ABSL_FLAG(uint64_t, max_comms_per_session, 1024, "Communicators per session (0: no limit)");
ABSL_FLAG(uint64_t, max_comms_per_job, 4096, "Communicator memberships per job (0: no limit)");
ABSL_FLAG(uint64_t, max_queued_ops_per_session, 4096,
          "Collectives a session may have queued ahead of the slowest rank (0: no limit)");
ABSL_FLAG(uint64_t, max_queued_ops_per_job, 16384,
          "Collectives a job may have queued ahead of the slowest rank (0: no limit)");
ABSL_FLAG(uint64_t, max_queued_p2p_per_session, 4096,
          "Send/recv messages a session may have waiting for their peer (0: no limit)");
ABSL_FLAG(uint64_t, max_queued_p2p_per_job, 16384,
          "Send/recv messages a job may have waiting for their peer (0: no limit)");
ABSL_FLAG(uint64_t, max_completion_backlog_bytes_per_session, 16 << 20,
          "Bytes of completions not yet read by a session's client before its submits are refused");
ABSL_FLAG(uint64_t, max_completion_backlog_bytes_per_job, 64 << 20,
          "Bytes of completions not yet read by a job's clients before their submits are refused");
ABSL_FLAG(uint64_t, max_residual_bytes_per_session, uint64_t{16} << 30,
          "Bytes of error-feedback residuals (compressed AllReduce with a compression_key) a "
          "session's communicators may hold (0: no limit)");
ABSL_FLAG(uint64_t, max_residual_bytes_per_job, uint64_t{32} << 30,
          "Bytes of error-feedback residuals a job may hold on this node (0: no limit)");
ABSL_FLAG(int, worker_threads, 0,
          "Threads executing collectives (0: one per CPU railyardd may run on, see --cpus)");
ABSL_FLAG(std::string, cpus, "",
          "CPUs railyardd runs on, as a list like 0-3,8 (taskset's): every thread of the daemon "
          "is pinned to them at start-up, e.g. the NIC's local cores; empty: wherever the "
          "scheduler puts it (within an inherited affinity or cgroup cpuset)");
ABSL_FLAG(absl::Duration, op_timeout, absl::Seconds(300),
          "Default wait for the other ranks' matching submission of an operation");
ABSL_FLAG(absl::Duration, init_timeout, absl::Seconds(120),
          "Default wait for all ranks to join a communicator");
ABSL_FLAG(absl::Duration, join_timeout, absl::Seconds(120),
          "Longest wait of a communicator join for its other ranks, whatever the client or peer "
          "asks (they may ask for less); also caps --init_timeout for joins");
ABSL_FLAG(uint64_t, max_pending_joins, 1024,
          "Communicator bootstraps this daemon coordinates that may wait for ranks at once");
ABSL_FLAG(uint64_t, max_pending_joins_per_job, 64,
          "Of --max_pending_joins, how many one job may hold (0: no share)");
ABSL_FLAG(uint64_t, max_client_connections, 4096,
          "Connections the client socket serves at once (also at most half the descriptors the "
          "daemon may open)");
ABSL_FLAG(uint64_t, max_client_connections_per_uid, 512,
          "Of --max_client_connections, how many one uid (SO_PEERCRED) may hold (0: no share)");
ABSL_FLAG(uint64_t, max_held_ops_per_session, 8192,
          "Operations one session may have held waiting for their streams (stream_sync)");
ABSL_FLAG(uint64_t, max_held_ops_per_job, 16384,
          "Operations one job may have held waiting for their streams (stream_sync)");
ABSL_FLAG(int32_t, data_plane_nice, 5,
          "How much nicer than the daemon its data-plane threads run (0..19): under CPU "
          "contention heartbeats, keepalives and Status are scheduled first");
ABSL_FLAG(uint64_t, max_mappings, 0,
          "Memory mappings the daemon makes for clients' host buffers and rings (0: 3/4 of "
          "vm.max_map_count)");
ABSL_FLAG(uint64_t, max_mappings_per_job, 0,
          "Of --max_mappings, how many one job may hold (0: a quarter of them)");
ABSL_FLAG(uint64_t, max_unbound_side_channels, 256,
          "Side-channel (<socket>.fd) connections that may wait for their Connect at once");
ABSL_FLAG(uint64_t, max_unbound_side_channels_per_uid, 32,
          "Of --max_unbound_side_channels, how many one uid may hold (0: no share)");
ABSL_FLAG(int64_t, chunk_bytes, 256 * 1024,
          "Bytes per step of a local plan; across daemons the largest chunk the tuner tries (it "
          "also tries a half and a quarter of it), and the chunk of an algorithm --algo forces");
ABSL_FLAG(int64_t, spin_us, 10,
          "Microseconds a session's ring thread spins after its last submission before it sleeps "
          "on the doorbell (0: sleep at once)");
ABSL_FLAG(int64_t, poll_us, 200,
          "How long a session's ring thread keeps going after its last submission or completion "
          "while operations are in flight (on a multi-node daemon it polls the UCX rails "
          "meanwhile, running inter-node transfers on its own thread), and the most its idle spin "
          "grows to for a client that submits again that soon (0: spin_us only)");
ABSL_FLAG(std::string, ring_threads, "job",
          "Which sessions' rings share a ring thread: \"job\" (the sessions of one job on this "
          "node: its ranks wait for each other anyway, and one thread spinning for them leaves "
          "the cores to the ranks) or \"session\" (a thread per session)");
ABSL_FLAG(int64_t, stream_poll_us, 100,
          "The longest the daemon sleeps between looks at the ready words of operations held for "
          "their clients' streams (stream ordering, docs/gpu.md): the most an operation may start "
          "late once its stream reached it; it spins --spin_us after each one it lets go");
ABSL_FLAG(uint64_t, staging_inline_bytes, uint64_t{1} << 20,
          "Device memory staged through host memory across nodes: an operation copying at most "
          "this many bytes copies on the thread that took its submission; a larger one is handed, "
          "in submission order, to the device's thread, so the session's other submissions do "
          "not wait for the copy (docs/gpu.md; 0: always the device's thread)");
ABSL_FLAG(uint64_t, staging_chunk_bytes, uint64_t{4} << 20,
          "The most a staging copy between device and host memory moves per task of the device's "
          "thread: the device's other queued work (other tenants' operations) runs between "
          "chunks (docs/gpu.md; at least 4096)");
ABSL_FLAG(bool, staging_pipeline, true,
          "A collective staged on the device's thread (past --staging_inline_bytes) goes to its "
          "communicator once its host memory is leased, its steps waiting for the chunks they "
          "touch, instead of after the whole copy (docs/gpu.md; false: after the whole copy)");
ABSL_FLAG(uint64_t, staging_cache_bytes, uint64_t{512} << 20,
          "Page-locked host memory the daemon keeps, idle, for reuse by operations that stage "
          "device memory across nodes (docs/gpu.md); buffers beyond it are freed when their "
          "operation ends (0: none kept)");
ABSL_FLAG(bool, cuda_ipc, false,
          "Accept device memory registered as legacy CUDA IPC handles (cudaIpcGetMemHandle), the "
          "fallback for memory that is not a VMM allocation. Off by default: such a handle is not "
          "bound to the process that made it, and opening it needs the daemon to see the "
          "client's processes (hostIPC pods; docs/gpu.md)");
ABSL_FLAG(int64_t, fake_gpus, 0,
          "TEST BUILD ONLY (railyardd-testing; the installed railyardd refuses it): serve this "
          "many fake GPUs, whose device memory is memfds named railyard-fake-device-<N> "
          "(daemon/device/fake_device_runtime.h), instead of CUDA's devices");
ABSL_FLAG(int64_t, inline_max_bytes, 64 * 1024,
          "One-node collectives moving at most this many bytes run on the thread of the last "
          "submission, without waking the worker pool (0: always the pool)");
ABSL_FLAG(absl::Duration, ucx_busy_poll, absl::ZeroDuration(),
          "After each burst of inter-node traffic, how long a UCX rail's progress thread keeps "
          "polling before it sleeps on its event fd (CPU only right after traffic, none idle); "
          "0: sleep at once");
ABSL_FLAG(std::string, rail_tcp_congestion, "auto",
          "TCP congestion control of the rails' UCX tcp sockets: auto (a socket on bbr, whose "
          "pacing collapses on microsecond paths, gets cubic, else reno; any other host choice "
          "is kept), host (leave them as the host made them), or names tried in order "
          "(e.g. cubic,reno); docs/data-plane.md");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(2),
          "How long shutdown waits for RPCs in flight before cancelling them");
ABSL_FLAG(bool, takeover, false,
          "Take the node over from the railyardd serving --socket, without failing its clients' "
          "jobs: its listening sockets come over <socket>.handover, its clients move here and it "
          "exits (docs/restarts.md). Start it with the same flags");
ABSL_FLAG(bool, takeover_if_serving, false,
          "Take over as --takeover does when a railyardd serves --socket, else start as usual "
          "(the DaemonSet's pods: the first on a node starts, the next one takes over)");
ABSL_FLAG(std::string, after_handover, "exit",
          "What a railyardd does once it handed the node over: exit, or wait (idle, serving "
          "nothing, until SIGTERM: a pod replaced by a RollingUpdate, which the kubelet would "
          "restart if it exited)");
ABSL_FLAG(std::string, on_stop, "drain",
          "What SIGTERM or SIGINT does to the sessions: drain (the collectives every local rank "
          "submitted finish, within --handover_drain (5 s at most); the rest go back to their "
          "clients, which "
          "wait RAILYARD_RECONNECT_S for the next railyardd on the socket and run them there: "
          "a restart fails nothing), or cancel (every pending operation fails CANCELLED at once)");
ABSL_FLAG(absl::Duration, takeover_timeout, absl::Seconds(60),
          "How long a takeover may take: the new railyardd's wait for the old one, and the old "
          "one's wait for the new one to serve");
ABSL_FLAG(absl::Duration, handover_drain, absl::Seconds(30),
          "How long a railyardd handing over lets running collectives finish before it ends "
          "its sessions anyway");
ABSL_FLAG(std::string, integrity, "none",
          "End-to-end check of inter-node transfers this daemon asks for in its communicators: "
          "none, or crc32c (a CRC-32C per chunk, verified on receipt; a mismatch fails the "
          "operation with DATA_LOSS). A job may ask for it too (RAILYARD_INTEGRITY); the "
          "strongest asked wins");
ABSL_FLAG(uint64_t, test_flip_bit_every, 0,
          "TEST BUILD ONLY (railyardd-testing; the installed railyardd refuses it): flip one "
          "random bit in the payload of every Nth message this daemon sends to another daemon "
          "(fault injection for the integrity tests); 0: off");
ABSL_FLAG(int64_t, test_frame_split_min_bytes, -1,
          "BENCHMARKS ONLY: payloads of at least this many bytes travel as two messages (payload, "
          "then the frame trailer) instead of one; 0: never, -1: the built-in threshold. Part of "
          "the wire format: every daemon must run with the same value");
ABSL_FLAG(std::string, log_level, "info", "Minimum log level: debug, info, warn, error");
ABSL_FLAG(std::string, state_dir, "/var/lib/railyard",
          "Directory for persistent state: calibration.json (railctl calibrate); read at start");

namespace railyard {
namespace {

// The peer plane is mutual TLS or, said explicitly, plaintext: never plaintext by omission.
absl::Status CheckPeerSecurity(const DaemonConfig& c) {
  const std::pair<const char*, const std::string*> files[] = {{"--peer_tls_cert", &c.peer_tls_cert},
                                                              {"--peer_tls_key", &c.peer_tls_key},
                                                              {"--peer_tls_ca", &c.peer_tls_ca}};
  std::vector<std::string> given, missing;
  for (const auto& [flag, value] : files) (value->empty() ? missing : given).push_back(flag);
  if (c.peer_listen.empty()) {
    if (!given.empty() || c.peer_insecure) {
      Log(LogLevel::kWarning, "daemon", "peer security flags ignored",
          {F("why", "no --peer_listen: this daemon serves no peer service")});
    }
    return absl::OkStatus();
  }
  if (c.peer_insecure && !given.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--peer_insecure and ", absl::StrJoin(given, ", "),
        " are both set: choose mutual TLS (--peer_tls_cert, --peer_tls_key, --peer_tls_ca) or "
        "plaintext (--peer_insecure), not both"));
  }
  if (c.peer_insecure) return absl::OkStatus();
  if (given.empty()) {
    return absl::InvalidArgumentError(
        "--peer_listen needs the peer service's mutual TLS: pass --peer_tls_cert (this node's "
        "certificate), --peer_tls_key (its key) and --peer_tls_ca (the cluster CA), PEM files; "
        "or --peer_insecure for plaintext with no authentication (loopback demos only)");
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mutual TLS of the peer service is incomplete: ", absl::StrJoin(given, ", "),
                     " given but ", absl::StrJoin(missing, " and "),
                     " missing (--peer_tls_cert, --peer_tls_key and --peer_tls_ca go together)"));
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& DaemonFlagNames() {
  static const auto* names =
      new std::vector<std::string>{"socket",
                                   "node_name",
                                   "peer_listen",
                                   "peer_tls_cert",
                                   "peer_tls_key",
                                   "peer_tls_ca",
                                   "peer_insecure",
                                   "job_tokens",
                                   "worker_threads",
                                   "cpus",
                                   "op_timeout",
                                   "init_timeout",
                                   "join_timeout",
                                   "max_pending_joins",
                                   "max_pending_joins_per_job",
                                   "max_unbound_side_channels",
                                   "max_client_connections",
                                   "max_held_ops_per_session",
                                   "max_mappings",
                                   "data_plane_nice",
                                   "max_mappings_per_job",
                                   "max_held_ops_per_job",
                                   "max_client_connections_per_uid",
                                   "max_unbound_side_channels_per_uid",
                                   "chunk_bytes",
                                   "spin_us",
                                   "poll_us",
                                   "ring_threads",
                                   "stream_poll_us",
                                   "staging_cache_bytes",
                                   "staging_inline_bytes",
                                   "staging_chunk_bytes",
                                   "staging_pipeline",
                                   "cuda_ipc",
                                   "inline_max_bytes",
                                   "ucx_busy_poll",
                                   "rail_tcp_congestion",
                                   "shutdown_grace",
                                   "takeover",
                                   "takeover_timeout",
                                   "takeover_if_serving",
                                   "after_handover",
                                   "on_stop",
                                   "handover_drain",
                                   "log_level",
                                   "topology",
                                   "algo",
                                   "peer_timeout",
                                   "rail_stall_timeout",
                                   "metrics_listen",
                                   "state_dir",
                                   "admin_socket",
                                   "token_key_file",
                                   "insecure_first_session_token",
                                   "job_policy",
                                   "job_weights",
                                   "max_sessions",
                                   "max_sessions_per_job",
                                   "max_metric_jobs",
                                   "max_buffers_per_session",
                                   "max_buffers_per_job",
                                   "max_buffer_bytes_per_session",
                                   "max_buffer_bytes_per_job",
                                   "max_comms_per_session",
                                   "max_comms_per_job",
                                   "max_queued_ops_per_session",
                                   "max_queued_ops_per_job",
                                   "max_queued_p2p_per_session",
                                   "max_queued_p2p_per_job",
                                   "max_completion_backlog_bytes_per_session",
                                   "max_completion_backlog_bytes_per_job",
                                   "max_residual_bytes_per_session",
                                   "max_residual_bytes_per_job",
                                   "integrity"};
  // Not test_flip_bit_every nor test_frame_split_min_bytes: test-only knobs are never taken from
  // the environment.
  return *names;
}

absl::Status ApplyEnvironment(const char* (*getenv_fn)(const char*)) {
  for (const std::string& name : DaemonFlagNames()) {
    std::string var = "RAILYARD_";
    for (char c : name)
      var.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
    const char* value = getenv_fn(var.c_str());
    if (value == nullptr) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("environment ", var, "=", value, ": ", error));
    }
  }
  return absl::OkStatus();
}

uint64_t NodeMemoryBytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "MemTotal: %lu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024;
}

absl::StatusOr<DaemonConfig> ConfigFromFlags() {
  DaemonConfig c;
  c.socket = absl::GetFlag(FLAGS_socket);
  c.node_name = absl::GetFlag(FLAGS_node_name);
  if (c.node_name.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') {
      c.node_name = host;
    } else {
      c.node_name = "localhost";
    }
  }
  // Written into comm ids (local:<node>) and every layout: peers refuse what CheckNodeName does.
  if (absl::Status s = CheckNodeName(c.node_name, "--node_name"); !s.ok()) return s;
  c.peer_listen = absl::GetFlag(FLAGS_peer_listen);
  c.peer_tls_cert = absl::GetFlag(FLAGS_peer_tls_cert);
  c.peer_tls_key = absl::GetFlag(FLAGS_peer_tls_key);
  c.peer_tls_ca = absl::GetFlag(FLAGS_peer_tls_ca);
  c.peer_insecure = absl::GetFlag(FLAGS_peer_insecure);
  if (absl::Status s = CheckPeerSecurity(c); !s.ok()) return s;
  c.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  c.job_tokens_file = absl::GetFlag(FLAGS_job_tokens);
  c.token_key_file = absl::GetFlag(FLAGS_token_key_file);
  c.insecure_first_session_token = absl::GetFlag(FLAGS_insecure_first_session_token);
  c.job_policy_file = absl::GetFlag(FLAGS_job_policy);
  c.job_weights_file = absl::GetFlag(FLAGS_job_weights);
  c.admin_socket = absl::GetFlag(FLAGS_admin_socket);
  if (c.admin_socket.empty()) c.admin_socket = c.socket + ".admin";
  if (c.admin_socket == c.socket || c.admin_socket == c.socket + ".fd") {
    return absl::InvalidArgumentError(
        "--admin_socket must differ from --socket and its .fd side channel: Admin is for "
        "operators only");
  }
  QuotaLimits& q = c.quotas;
  q.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  q.max_sessions_per_job = absl::GetFlag(FLAGS_max_sessions_per_job);
  q.max_metric_jobs = absl::GetFlag(FLAGS_max_metric_jobs);
  auto set = [&q](Resource r, uint64_t per_session, uint64_t per_job) {
    q.per_session[static_cast<int>(r)] = per_session;
    q.per_job[static_cast<int>(r)] = per_job;
  };
  set(Resource::kBuffers, absl::GetFlag(FLAGS_max_buffers_per_session),
      absl::GetFlag(FLAGS_max_buffers_per_job));
  // Registered bytes are what a tenant can make the daemon touch: unless given, sized for the
  // node rather than for a petabyte.
  const uint64_t mem = NodeMemoryBytes();
  const auto node_sized = [mem](const char* name, uint64_t value, uint64_t divisor) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    const bool given = flag != nullptr && flag->CurrentValue() != flag->DefaultValue();
    return given || mem == 0 ? value : std::min(value, mem / divisor);
  };
  set(Resource::kBufferBytes,
      node_sized("max_buffer_bytes_per_session", absl::GetFlag(FLAGS_max_buffer_bytes_per_session),
                 8),
      node_sized("max_buffer_bytes_per_job", absl::GetFlag(FLAGS_max_buffer_bytes_per_job), 4));
  set(Resource::kComms, absl::GetFlag(FLAGS_max_comms_per_session),
      absl::GetFlag(FLAGS_max_comms_per_job));
  set(Resource::kQueuedOps, absl::GetFlag(FLAGS_max_queued_ops_per_session),
      absl::GetFlag(FLAGS_max_queued_ops_per_job));
  set(Resource::kQueuedP2p, absl::GetFlag(FLAGS_max_queued_p2p_per_session),
      absl::GetFlag(FLAGS_max_queued_p2p_per_job));
  set(Resource::kCompletionBytes, absl::GetFlag(FLAGS_max_completion_backlog_bytes_per_session),
      absl::GetFlag(FLAGS_max_completion_backlog_bytes_per_job));
  set(Resource::kResidualBytes, absl::GetFlag(FLAGS_max_residual_bytes_per_session),
      absl::GetFlag(FLAGS_max_residual_bytes_per_job));
  c.topology_file = absl::GetFlag(FLAGS_topology);
  c.algo = absl::GetFlag(FLAGS_algo);
  if (!c.algo.empty() && !scheduler::algorithms::IsAlgorithmName(c.algo)) {
    return absl::InvalidArgumentError(absl::StrCat("--algo '", c.algo, "' is not one of ",
                                                   scheduler::algorithms::AlgorithmNames()));
  }
  c.peer_timeout = absl::GetFlag(FLAGS_peer_timeout);
  if (c.peer_timeout <= absl::ZeroDuration() || c.peer_timeout > absl::Minutes(10)) {
    return absl::InvalidArgumentError("--peer_timeout must be in (0, 10m]");
  }
  c.rail_stall_timeout = absl::GetFlag(FLAGS_rail_stall_timeout);
  if (c.rail_stall_timeout < absl::ZeroDuration() || c.rail_stall_timeout > absl::Minutes(10)) {
    return absl::InvalidArgumentError("--rail_stall_timeout must be in [0, 10m] (0: never)");
  }
  if (const std::string cpus = absl::GetFlag(FLAGS_cpus); !cpus.empty()) {
    absl::StatusOr<std::vector<int>> list = ParseCpuMask(cpus);
    if (!list.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cpus=", cpus, ": ", list.status().message()));
    }
    c.cpus = *std::move(list);
  }
  c.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  if (c.worker_threads < 0 || c.worker_threads > 1024) {
    return absl::InvalidArgumentError("--worker_threads must be in [0, 1024]");
  }
  c.op_timeout = absl::GetFlag(FLAGS_op_timeout);
  c.init_timeout = absl::GetFlag(FLAGS_init_timeout);
  if (c.op_timeout <= absl::ZeroDuration() || c.init_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--op_timeout and --init_timeout must be positive");
  }
  c.join_timeout = absl::GetFlag(FLAGS_join_timeout);
  if (c.join_timeout <= absl::ZeroDuration() || c.join_timeout > absl::Hours(24)) {
    return absl::InvalidArgumentError("--join_timeout must be in (0, 24h]");
  }
  if (c.init_timeout > c.join_timeout) {
    Log(LogLevel::kWarning, "daemon", "--init_timeout is longer than --join_timeout",
        {F("init_timeout", absl::FormatDuration(c.init_timeout)),
         F("join_timeout", absl::FormatDuration(c.join_timeout)),
         F("effect", "joins wait at most --join_timeout")});
  }
  const uint64_t pending = absl::GetFlag(FLAGS_max_pending_joins);
  if (pending < 1 || pending > (uint64_t{1} << 20)) {
    return absl::InvalidArgumentError("--max_pending_joins must be in [1, 2^20]");
  }
  c.max_pending_joins = static_cast<size_t>(pending);
  c.data_plane_nice = absl::GetFlag(FLAGS_data_plane_nice);
  if (c.data_plane_nice < 0 || c.data_plane_nice > 19) {
    return absl::InvalidArgumentError("--data_plane_nice must be in [0, 19]");
  }
  c.max_mappings = static_cast<size_t>(absl::GetFlag(FLAGS_max_mappings));
  c.max_mappings_per_job = static_cast<size_t>(absl::GetFlag(FLAGS_max_mappings_per_job));
  if (c.max_mappings >= MappingBudget::KernelLimit()) {
    return absl::InvalidArgumentError(absl::StrCat("--max_mappings ", c.max_mappings,
                                                   " leaves the daemon no mapping of its own below "
                                                   "vm.max_map_count (",
                                                   MappingBudget::KernelLimit(), ")"));
  }
  c.max_held_ops_per_session = static_cast<size_t>(
      std::clamp<uint64_t>(absl::GetFlag(FLAGS_max_held_ops_per_session), 1, 1 << 20));
  c.max_held_ops_per_job = static_cast<size_t>(
      std::clamp<uint64_t>(absl::GetFlag(FLAGS_max_held_ops_per_job), 1, 1 << 20));
  c.max_client_connections = static_cast<size_t>(
      std::clamp<uint64_t>(absl::GetFlag(FLAGS_max_client_connections), 1, 1 << 20));
  c.max_client_connections_per_uid = static_cast<size_t>(std::min<uint64_t>(
      absl::GetFlag(FLAGS_max_client_connections_per_uid), c.max_client_connections));
  c.max_unbound_side_channels = static_cast<size_t>(
      std::clamp<uint64_t>(absl::GetFlag(FLAGS_max_unbound_side_channels), 1, 1 << 16));
  c.max_unbound_side_channels_per_uid = static_cast<size_t>(std::min<uint64_t>(
      absl::GetFlag(FLAGS_max_unbound_side_channels_per_uid), c.max_unbound_side_channels));
  c.max_pending_joins_per_job = static_cast<size_t>(
      std::min<uint64_t>(absl::GetFlag(FLAGS_max_pending_joins_per_job), c.max_pending_joins));
  const int64_t chunk = absl::GetFlag(FLAGS_chunk_bytes);
  if (chunk < 4096 || chunk > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("--chunk_bytes must be in [4096, 2^30]");
  }
  c.chunk_bytes = static_cast<size_t>(chunk);
  const int64_t spin_us = absl::GetFlag(FLAGS_spin_us);
  if (spin_us < 0 || spin_us > 1000000) {
    return absl::InvalidArgumentError("--spin_us must be in [0, 1000000]");
  }
  c.spin = absl::Microseconds(spin_us);
  const int64_t poll_us = absl::GetFlag(FLAGS_poll_us);
  if (poll_us < 0 || poll_us > 1000000) {
    return absl::InvalidArgumentError("--poll_us must be in [0, 1000000]");
  }
  c.poll = absl::Microseconds(poll_us);
  const std::string ring_threads = absl::GetFlag(FLAGS_ring_threads);
  if (ring_threads != "job" && ring_threads != "session") {
    return absl::InvalidArgumentError(
        absl::StrCat("--ring_threads must be \"job\" or \"session\", not \"", ring_threads, "\""));
  }
  c.ring_thread_per_session = ring_threads == "session";
  const int64_t stream_poll_us = absl::GetFlag(FLAGS_stream_poll_us);
  if (stream_poll_us < 1 || stream_poll_us > 1000000) {
    return absl::InvalidArgumentError("--stream_poll_us must be in [1, 1000000]");
  }
  c.stream_poll = absl::Microseconds(stream_poll_us);
  c.staging_cache_bytes = absl::GetFlag(FLAGS_staging_cache_bytes);
  c.staging_inline_bytes = absl::GetFlag(FLAGS_staging_inline_bytes);
  c.staging_chunk_bytes = absl::GetFlag(FLAGS_staging_chunk_bytes);
  c.staging_pipeline = absl::GetFlag(FLAGS_staging_pipeline);
  if (c.staging_chunk_bytes < 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--staging_chunk_bytes must be at least 4096, not ", c.staging_chunk_bytes));
  }
  c.cuda_ipc = absl::GetFlag(FLAGS_cuda_ipc);
  const int64_t inline_max = absl::GetFlag(FLAGS_inline_max_bytes);
  if (inline_max < 0 || inline_max > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("--inline_max_bytes must be in [0, 2^30]");
  }
  c.inline_max_bytes = static_cast<size_t>(inline_max);
  const int64_t fake_gpus = absl::GetFlag(FLAGS_fake_gpus);
  if (fake_gpus < 0 || fake_gpus > 64) {
    return absl::InvalidArgumentError("--fake_gpus must be in [0, 64]");
  }
  c.fake_gpus = static_cast<int>(fake_gpus);
  c.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  c.takeover = absl::GetFlag(FLAGS_takeover);
  c.takeover_timeout = absl::GetFlag(FLAGS_takeover_timeout);
  c.takeover_if_serving = absl::GetFlag(FLAGS_takeover_if_serving);
  const std::string after = absl::GetFlag(FLAGS_after_handover);
  if (after != "exit" && after != "wait") {
    return absl::InvalidArgumentError(
        absl::StrCat("--after_handover=", after, ": expected exit or wait"));
  }
  c.exit_after_handover = after == "exit";
  const std::string on_stop = absl::GetFlag(FLAGS_on_stop);
  if (on_stop != "drain" && on_stop != "cancel") {
    return absl::InvalidArgumentError(
        absl::StrCat("--on_stop=", on_stop, ": expected drain or cancel"));
  }
  c.drain_on_stop = on_stop == "drain";
  c.handover_drain = absl::GetFlag(FLAGS_handover_drain);
  if (c.takeover_timeout < absl::Seconds(1) || c.takeover_timeout > absl::Hours(1)) {
    return absl::InvalidArgumentError("--takeover_timeout must be in [1s, 1h]");
  }
  if (c.handover_drain < absl::ZeroDuration() || c.handover_drain > absl::Hours(1)) {
    return absl::InvalidArgumentError("--handover_drain must be in [0, 1h]");
  }
  c.state_dir = absl::GetFlag(FLAGS_state_dir);
  c.ucx_busy_poll = absl::GetFlag(FLAGS_ucx_busy_poll);
  if (c.ucx_busy_poll < absl::ZeroDuration() || c.ucx_busy_poll > absl::Seconds(1)) {
    return absl::InvalidArgumentError("--ucx_busy_poll must be in [0, 1s]");
  }
  absl::StatusOr<transport::TcpCongestionPolicy> congestion =
      transport::ParseTcpCongestionPolicy(absl::GetFlag(FLAGS_rail_tcp_congestion));
  if (!congestion.ok()) return congestion.status();
  c.rail_tcp_congestion = *std::move(congestion);
  c.integrity = absl::GetFlag(FLAGS_integrity);
  if (c.integrity != "none" && c.integrity != "crc32c") {
    return absl::InvalidArgumentError(
        absl::StrCat("--integrity must be none or crc32c, not \"", c.integrity, "\""));
  }
  c.test_flip_bit_every = absl::GetFlag(FLAGS_test_flip_bit_every);
  c.test_frame_split_min_bytes = absl::GetFlag(FLAGS_test_frame_split_min_bytes);
  LogLevel level;
  if (!ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    return absl::InvalidArgumentError("--log_level must be debug, info, warn or error");
  }
  SetLogLevel(level);
  return c;
}

}  // namespace railyard
