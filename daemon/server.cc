#include "daemon/server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "daemon/auth/signed_token.h"
#include "daemon/comm/peer_input.h"
#include "daemon/handover/handover.h"
#include "daemon/session/job_policy.h"
#include "daemon/session/job_tokens.h"
#include "daemon/topology/discovery.h"
#include "daemon/topology/topology_file.h"
#include "daemon/transport/ucx/ucx_components.h"
#include "daemon/transport/ucx/ucx_transport.h"
#include "daemon/util/log.h"
#include "daemon/util/thread_name.h"
#include "daemon/version.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "proto/railyard/v1/fd_channel.h"

namespace railyard {
namespace {

// Clients send an HTTP/2 keepalive ping on their session's channel every few seconds (both
// clients: 5 s by default, 1 s at least) so that a daemon that stops answering (stopped, wedged)
// ends their waits. gRPC's own default (5 minutes between pings without data) would answer their
// third ping with GOAWAY "too_many_pings"; half the clients' shortest period leaves room for
// timer jitter, and a client pinging more often than this still gets that GOAWAY.
constexpr int kMinClientPingIntervalMs = 500;

// True when something accepts connections on the Unix socket at path.
bool SomeoneListens(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// taking_over: the socket is another railyardd's, handed over (--takeover): only its directory.
absl::Status PrepareSocketPath(const std::string& path, bool taking_over) {
  if (path.empty()) return absl::InvalidArgumentError("--socket is empty");
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("--socket path is ", path.size(),
                                                   " bytes; Unix sockets allow at most ",
                                                   sizeof(sockaddr_un{}.sun_path) - 1));
  }
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create socket directory ", dir.string(), ": ", ec.message()));
  }
  struct stat st {};
  if (!taking_over && ::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
    }
    if (SomeoneListens(path)) {
      return absl::AlreadyExistsError(
          absl::StrCat("another daemon is already serving ", path,
                       " (to replace it without failing its jobs: railyardd --takeover with the "
                       "same flags)"));
    }
    ::unlink(path.c_str());  // stale socket of a daemon that died
  }
  return absl::OkStatus();
}

// What Admin.GetTopology serves: the declared topology completed by discovery. The rails UCX
// runs on stay the declared ones (StartPeerService); this copy is for people and the model.
v1::NodeTopology NodeGraph(v1::NodeTopology declared, const std::string& node_name) {
  declared.set_node(node_name);
  absl::StatusOr<v1::NodeTopology> discovered = topology::Discover("/");
  if (!discovered.ok()) {
    Log(LogLevel::kWarning, "daemon", "topology discovery failed",
        {F("error", discovered.status().message())});
    return declared;
  }
  return topology::MergeDiscovered(declared, *discovered);
}

// The host other daemons dial this one's peer service at, as comm ids coordinated here name it:
// the --peer_listen host, or the node name for a wildcard address. Empty when listen has no port.
std::string AdvertisedPeerHost(const std::string& listen, const std::string& node_name) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return "";
  std::string host = listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = node_name;
  return host;
}

}  // namespace

Server::~Server() { Shutdown(); }

absl::Status Server::Start() {
  // Every connection, memfd and UCX socket is a descriptor: the inherited soft limit (often
  // 1024 in containers) is not what the node allows. The client listener keeps a reserve and
  // caps its connections at half of what is left.
  const uint64_t fd_limit = ClientListener::RaiseDescriptorLimit();
  DataPlaneNice().store(config_.data_plane_nice);
  const uint64_t client_room = fd_limit > 2 * ClientListener::Options().fd_reserve
                                   ? (fd_limit - ClientListener::Options().fd_reserve) / 2
                                   : 64;
  if (config_.max_client_connections > client_room) {
    // The shares shrink with the pool: one uid still holds the same fraction of it, never all.
    config_.max_client_connections_per_uid = std::max<size_t>(
        std::min<size_t>(16, client_room),
        config_.max_client_connections_per_uid * client_room / config_.max_client_connections);
    config_.max_client_connections = client_room;
  }
  Log(LogLevel::kInfo, "daemon", "descriptors",
      {F("limit", fd_limit), F("max_client_connections", config_.max_client_connections),
       F("max_client_connections_per_uid", config_.max_client_connections_per_uid)});
  absl::StatusOr<SessionAuth> auth = LoadAuth();
  if (!auth.ok()) return auth.status();
  if (config_.takeover_if_serving && !config_.takeover &&
      SomeoneListens(handover::HandoverPath(config_.socket))) {
    config_.takeover = true;
  }
  if (config_.takeover) {
    // Before anything is bound: the old daemon's sockets are what this one will serve.
    absl::StatusOr<handover::Takeover> takeover =
        handover::Takeover::Begin(config_.socket, config_.takeover_timeout);
    if (!takeover.ok()) {
      return absl::Status(takeover.status().code(),
                          absl::StrCat("--takeover: ", takeover.status().message()));
    }
    Log(LogLevel::kInfo, "handover", "taking over",
        {F("from_pid", takeover->old_pid()), F("from_version", takeover->old_version()),
         F("protocol", takeover->old_protocol())});
    takeover_.emplace(*std::move(takeover));
  }
  v1::NodeTopology topology = topology::DefaultNodeTopology();
  if (!config_.topology_file.empty()) {
    auto loaded = topology::LoadNodeTopology(config_.topology_file);
    if (!loaded.ok()) return loaded.status();
    topology = *std::move(loaded);
    if (!topology.node().empty()) config_.node_name = topology.node();
    // This daemon's name in every layout and comm id: other daemons refuse what this refuses.
    if (absl::Status s =
            CheckNodeName(config_.node_name, absl::StrCat("node of ", config_.topology_file));
        !s.ok()) {
      return s;
    }
  }
  if (!config_.peer_listen.empty()) {
    if (config_.peer_insecure) {
      Log(LogLevel::kWarning, "daemon", "insecure: the peer service is plaintext, unauthenticated",
          {F("why", "--peer_insecure: anyone who reaches --peer_listen can act as a daemon"),
           F("fix", "--peer_tls_cert, --peer_tls_key and --peer_tls_ca")});
    } else {
      // The node name is final here (the topology file may set it): the certificate must name it.
      absl::StatusOr<auth::PeerTlsPem> tls =
          auth::LoadPeerTls(config_.peer_tls_cert, config_.peer_tls_key, config_.peer_tls_ca,
                            config_.node_name, absl::Now());
      if (!tls.ok()) return tls.status();
      // Ranks of other daemons dial a coordinator at the host its comm ids name and check its
      // certificate against that host: a certificate without it would fail every such join.
      const std::string host = AdvertisedPeerHost(config_.peer_listen, config_.node_name);
      absl::StatusOr<auth::CertNames> names = auth::SubjectAltNames(tls->cert_chain);
      if (!host.empty() && names.ok() && !auth::CertNamesHost(*names, host)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "certificate ", config_.peer_tls_cert, " (SANs: ", names->ToString(),
            ") does not name ", host, ", the host other daemons dial this one at (--peer_listen ",
            config_.peer_listen,
            "; comm ids coordinated here name it): add it to the certificate's subjectAltNames "
            "(IP or DNS), or listen on an address it names"));
      }
      peer_tls_ = *std::move(tls);
    }
  }
  const std::string fd_socket = fdproto::SocketPath(config_.socket);
  for (const std::string& path : {config_.socket, fd_socket, config_.admin_socket}) {
    if (absl::Status s = PrepareSocketPath(path, takeover_.has_value()); !s.ok()) return s;
  }
  // Test builds only (RunDaemon refuses the flags without the hooks): bit flips on every link.
  transport::LinkStack::WireLayer wire_layer;
  if (config_.test_flip_bit_every > 0 && hooks_.flip_bits != nullptr) {
    wire_layer = hooks_.flip_bits(config_.test_flip_bit_every);
  }
  core_ = std::make_unique<DaemonCore>(config_, *std::move(auth), std::move(wire_layer));
  if (config_.fake_gpus > 0 && hooks_.fake_devices != nullptr) {
    core_->SetDeviceRuntime(hooks_.fake_devices(config_.fake_gpus));
  } else {
    core_->SetDeviceRuntime(device::OpenDeviceRuntime());
  }
  Log(LogLevel::kInfo, "daemon", "devices", {F("devices", core_->DescribeDevices())});
  if (absl::Status s = core_->fair_share().LoadWeights(); !s.ok()) return s;
  FdChannelServer::Options fd_options;
  fd_options.path = fd_socket;
  fd_options.max_unbound = config_.max_unbound_side_channels;
  fd_options.max_unbound_per_uid = config_.max_unbound_side_channels_per_uid;
  if (config_.quotas.max_sessions != 0) {
    fd_options.max_connections = config_.quotas.max_sessions + fd_options.max_unbound;
  }
  absl::StatusOr<std::unique_ptr<FdChannelServer>> fd_channels =
      takeover_.has_value()
          ? FdChannelServer::Adopt(fd_options, takeover_->Take(handover::kSideChannel).Release())
          : FdChannelServer::Start(fd_options);
  if (!fd_channels.ok()) return fd_channels.status();
  fd_channels_ = *std::move(fd_channels);
  core_->SetFdChannels(fd_channels_.get());
  core_->SetNodeGraph(NodeGraph(topology, config_.node_name));
  if (!config_.peer_listen.empty()) {
    if (absl::Status s = StartPeerService(topology); !s.ok()) return s;
  }
  local_ = std::make_unique<LocalService>(core_.get());
  admin_ = std::make_unique<AdminService>(core_.get());
  // Admin first: once the client socket answers, the whole daemon does.
  if (absl::Status s = StartAdmin(); !s.ok()) return s;

  // railyardd accepts on the client socket itself and hands gRPC the connections it admits
  // (client_listener.h): gRPC's own listener does not survive running out of descriptors.
  ClientListener::Options listen;
  listen.path = config_.socket;
  listen.max_connections = config_.max_client_connections;
  listen.max_per_uid = config_.max_client_connections_per_uid;
  absl::StatusOr<std::unique_ptr<ClientListener>> listener =
      takeover_.has_value()
          ? ClientListener::Adopt(listen, takeover_->Take(handover::kClientSocket).Release())
          : ClientListener::Bind(listen);
  if (!listener.ok()) return listener.status();
  listener_ = *std::move(listener);
  socket_created_ = true;
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kMinClientPingIntervalMs);
  builder.RegisterService(local_.get());
  admin_refusal_ = std::make_unique<AdminRefusal>(config_.admin_socket);
  builder.RegisterCallbackGenericService(admin_refusal_.get());
  grpc_ = builder.BuildAndStart();
  if (grpc_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve unix:", config_.socket));
  }
  refusals_ = std::make_unique<RefusalServer>(listener_.get());
  listener_->Start(grpc_.get(), refusals_->server());
  if (takeover_.has_value()) {
    // Serving: the old daemon stops accepting (and frees its metrics port) before it answers.
    absl::StatusOr<uint32_t> moving = takeover_->Ready(config_.takeover_timeout);
    takeover_.reset();
    if (!moving.ok()) {
      // Both serve the sockets now; this one goes on (the old one's clients move on its exit).
      Log(LogLevel::kWarning, "handover", "no Released from the old railyardd",
          {F("reason", moving.status().message())});
    } else {
      Log(LogLevel::kInfo, "handover", "took over", {F("sessions_moving", *moving)});
    }
  }
  if (!config_.metrics_listen.empty()) {
    if (absl::Status s = StartMetrics(); !s.ok()) return s;
  }
  if (absl::Status s = StartHandover(); !s.ok()) return s;
  serving_ = true;
  Log(LogLevel::kInfo, "daemon", "serving",
      {F("version", kRailyardVersion), F("socket", config_.socket),
       F("admin_socket", config_.admin_socket), F("node", config_.node_name),
       F("coordinator", core_->joins().coordinator()),
       F("worker_threads", core_->Status().worker_threads())});
  return absl::OkStatus();
}

absl::StatusOr<SessionAuth> Server::LoadAuth() const {
  SessionAuth auth;
  if (!config_.job_tokens_file.empty()) {
    auto loaded = LoadJobTokens(config_.job_tokens_file);
    if (!loaded.ok()) return loaded.status();
    auth.fixed_tokens = *std::move(loaded);
  }
  if (!config_.token_key_file.empty()) {
    absl::StatusOr<std::vector<std::string>> keys = auth::LoadTokenKeys(config_.token_key_file);
    if (!keys.ok()) return keys.status();
    auth.is_signed = [](const std::string& token) { return auth::IsSignedToken(token); };
    auth.verify_signed = [keys = *std::move(keys)](const std::string& token,
                                                   const std::string& job) {
      return auth::VerifyToken(keys, token, job, absl::Now());
    };
  }
  if (!config_.job_policy_file.empty()) {
    absl::StatusOr<JobPolicy> policy = JobPolicy::Load(config_.job_policy_file);
    if (!policy.ok()) return policy.status();
    auth.policy = *std::move(policy);
  }
  const bool authenticated = !auth.fixed_tokens.empty() || !config_.token_key_file.empty();
  auth.first_session_sets_token = config_.insecure_first_session_token && !authenticated;
  if (config_.insecure_first_session_token && authenticated) {
    Log(LogLevel::kWarning, "daemon", "--insecure_first_session_token ignored",
        {F("why", "--token_key_file or --job_tokens is set: only their jobs may connect")});
  } else if (auth.first_session_sets_token) {
    Log(LogLevel::kWarning, "daemon", "insecure: the first session of a job sets its token",
        {F("why", "--insecure_first_session_token: any local process may claim an unused job id")});
  } else if (auth.fixed_tokens.empty() && config_.token_key_file.empty()) {
    Log(LogLevel::kWarning, "daemon", "no client authentication configured: every Connect fails",
        {F("fix", "--token_key_file, --job_tokens or --insecure_first_session_token")});
  }
  return auth;
}

absl::Status Server::StartAdmin() {
  // Operators only: the owner (root under systemd and in the DaemonSet). The socket must never be
  // reachable by anyone else, not even between bind and chmod (a connection made then would stay
  // open): bind it in a fresh 0700 directory, chmod it, and only then rename it into place.
  const std::string final_path = config_.admin_socket;
  std::string dir = std::filesystem::path(final_path).parent_path().string();
  std::string tmpl = absl::StrCat(dir.empty() ? "." : dir, "/.railyard-admin.XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create a private directory beside ",
                                                      final_path, ": ", std::strerror(errno)));
  }
  const std::string staging = tmpl + "/admin.sock";
  auto cleanup = [&] {
    ::unlink(staging.c_str());
    ::rmdir(tmpl.c_str());
  };
  if (staging.size() >= sizeof(sockaddr_un{}.sun_path)) {
    cleanup();
    return absl::InvalidArgumentError(
        absl::StrCat("--admin_socket ", final_path, " is too long for a Unix socket once staged"));
  }
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(absl::StrCat("unix:", staging), grpc::InsecureServerCredentials(),
                           &bound);
  builder.RegisterService(admin_.get());
  admin_grpc_ = builder.BuildAndStart();
  if (admin_grpc_ == nullptr || bound == 0) {
    cleanup();
    return absl::UnavailableError(absl::StrCat("cannot listen on unix:", final_path));
  }
  if (::chmod(staging.c_str(), 0600) != 0 || ::rename(staging.c_str(), final_path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    cleanup();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot put the admin socket at ", final_path, " (mode 0600): ", err));
  }
  ::rmdir(tmpl.c_str());
  admin_socket_created_ = true;
  return absl::OkStatus();
}

absl::Status Server::StartPeerService(const v1::NodeTopology& topology) {
  transport::UcxTransport::Options opts;
  opts.node_name = config_.node_name;
  opts.busy_poll = config_.ucx_busy_poll;
  opts.tcp_congestion = config_.rail_tcp_congestion;
  opts.report = [](bool warning, const std::string& message) {
    Log(warning ? LogLevel::kWarning : LogLevel::kInfo, "transport", message);
  };
  for (const v1::Rail& rail : topology.rails()) {
    transport::UcxTransport::Rail r;
    r.device = rail.device();
    if (!rail.transports().empty()) r.tls = rail.transports();
    if (rail.speed_gbps() > 0) r.speed_bytes_per_s = rail.speed_gbps() * 1e9 / 8;
    opts.rails.push_back(r);
  }
  absl::StatusOr<std::unique_ptr<transport::UcxTransport>> transport =
      transport::UcxTransport::Create(opts);
  if (!transport.ok()) return transport.status();

  const std::string& listen = config_.peer_listen;
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_listen '", listen, "' is not host:port"));
  }
  peer_ = std::make_unique<PeerService>(core_.get());
  grpc::ServerBuilder builder;
  int port = 0;
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (peer_tls_.has_value()) {
    // Mutual TLS: every caller presents a certificate the cluster CA signed (PeerService reads
    // its subjectAltNames into the PeerIdentity the core checks claims against).
    grpc::SslServerCredentialsOptions tls(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    tls.pem_root_certs = peer_tls_->ca;
    tls.pem_key_cert_pairs.push_back({peer_tls_->private_key, peer_tls_->cert_chain});
    credentials = grpc::SslServerCredentials(tls);
  }
  builder.AddListeningPort(listen, credentials, &port);
  builder.RegisterService(peer_.get());
  peer_grpc_ = builder.BuildAndStart();
  if (peer_grpc_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --peer_listen ", listen));
  }
  peer_address_ = absl::StrCat(AdvertisedPeerHost(listen, config_.node_name), ":", port);
  core_->SetPeerCredentials(peer_tls_);
  core_->EnableMultiNode(topology, *std::move(transport), peer_address_);
  // Device memory crosses nodes staged through host memory; say whether this UCX could do
  // GPUDirect instead (its CUDA transports), which is not built yet.
  absl::StatusOr<std::vector<std::string>> components = transport::UcxComponents();
  std::string cross_node = "staged through host memory";
  if (!components.ok()) {
    absl::StrAppend(&cross_node, " (UCX's components unknown: ", components.status().message(),
                    ")");
  } else if (const std::vector<std::string> cuda = transport::CudaTransports(*components);
             cuda.empty()) {
    absl::StrAppend(&cross_node,
                    " (this UCX has no CUDA transports: ", absl::StrJoin(*components, ", "), ")");
  } else {
    absl::StrAppend(&cross_node, " (this UCX has ", absl::StrJoin(cuda, ", "),
                    "; GPUDirect through them is not built yet)");
  }
  core_->SetCrossNodeDevicePath(cross_node);
  Log(LogLevel::kInfo, "daemon", "peer service",
      {F("peer_address", peer_address_), F("rails", topology.rails_size()),
       F("security", peer_tls_.has_value() ? "mutual TLS" : "plaintext (--peer_insecure)")});
  return absl::OkStatus();
}

void Server::ExportListenerMetrics() {
  metrics::Registry& reg = core_->metrics().registry();
  metrics::Family<metrics::Gauge>& conns = reg.AddGauge(
      "railyard_client_connections",
      "Connections to the client socket: open (admitted) and refusing (being told why they were "
      "refused, about two seconds each)");
  metrics::Family<metrics::Counter>& refused = reg.AddCounter(
      "railyard_client_connections_refused_total",
      "Client-socket connections refused, by reason: uid_share "
      "(--max_client_connections_per_uid), pool (--max_client_connections), descriptors (the "
      "daemon's descriptor reserve), accept_failed (EMFILE and the like: shed unanswered)");
  for (const char* reason : {"uid_share", "pool", "descriptors", "accept_failed"}) {
    refused.Add({{"reason", reason}});  // every series from the start, at 0
  }
  auto last = std::make_shared<ClientListener::Counts>();
  reg.AddCollectHook([this, &conns, &refused, last] {
    if (listener_ == nullptr) return;
    const ClientListener::Counts c = listener_->counts();
    conns.Add({{"state", "open"}}).Set(static_cast<double>(c.open));
    conns.Add({{"state", "refusing"}}).Set(static_cast<double>(c.refusing));
    const auto add = [&](const char* reason, uint64_t now, uint64_t* seen) {
      refused.Add({{"reason", reason}}).Increment(static_cast<double>(now - *seen));
      *seen = now;
    };
    add("uid_share", c.refused_share, &last->refused_share);
    add("pool", c.refused_pool, &last->refused_pool);
    add("descriptors", c.refused_descriptors, &last->refused_descriptors);
    add("accept_failed", c.accept_failures, &last->accept_failures);
  });
}

absl::Status Server::StartMetrics() {
  ExportListenerMetrics();
  metrics_http_ = std::make_unique<metrics::HttpServer>(&core_->metrics().registry(),
                                                        [this] { return serving_.load(); });
  absl::StatusOr<std::string> bound = metrics_http_->Start(config_.metrics_listen);
  if (!bound.ok()) return bound.status();
  metrics_address_ = *bound;
  Log(LogLevel::kInfo, "daemon", "metrics",
      {F("metrics_address", metrics_address_),
       F("url", absl::StrCat("http://", metrics_address_, "/metrics"))});
  return absl::OkStatus();
}

absl::Status Server::StartHandover() {
  handover::HandoverServer::Hooks hooks;
  hooks.offer = [this] {
    return std::vector<std::pair<std::string, int>>{
        {handover::kClientSocket, listener_->listen_fd()},
        {handover::kSideChannel, fd_channels_->listen_fd()}};
  };
  hooks.release = [this]() -> uint32_t {
    serving_ = false;  // /readyz of this one: 503 (the port goes to the new one below)
    listener_->Release();
    if (metrics_http_ != nullptr) metrics_http_->Stop();
    // The paths are the new daemon's now: nothing here removes them.
    socket_created_ = false;
    admin_socket_created_ = false;
    return static_cast<uint32_t>(core_->session_count());
  };
  hooks.hand_over = [this] {
    fd_channels_->Release();
    core_->HandOver(config_.handover_drain);
    // Its clients' connections end here: a client reconnecting must reach the new daemon, not
    // find this one's connection still open.
    if (grpc_ != nullptr) grpc_->Shutdown(absl::ToChronoTime(absl::Now() + config_.shutdown_grace));
    if (!config_.exit_after_handover) {
      Log(LogLevel::kInfo, "handover", "handed over; idle until SIGTERM (--after_handover=wait)");
      return;
    }
    // Exits through the signal loop of RunDaemon (Shutdown, without the socket files).
    ::kill(::getpid(), SIGTERM);
  };
  absl::StatusOr<std::unique_ptr<handover::HandoverServer>> server =
      handover::HandoverServer::Start(handover::HandoverPath(config_.socket), config_.socket,
                                      config_.takeover_timeout, std::move(hooks));
  if (!server.ok()) return server.status();
  handover_ = *std::move(server);
  return absl::OkStatus();
}

void Server::Shutdown() {
  if (core_ == nullptr) return;
  serving_ = false;  // /readyz: 503 from here on
  Log(LogLevel::kInfo, "daemon", "shutting down", {F("socket", config_.socket)});
  if (config_.drain_on_stop && (handover_ == nullptr || !handover_->handed_over()) &&
      core_->session_count() > 0) {
    // A restart (systemctl restart, a pod replaced): no new client reaches this daemon (the
    // socket goes now), what every local rank submitted finishes, the rest goes back to the
    // clients, which wait for the next railyardd on the socket (RAILYARD_RECONNECT_S) and run it
    // there, as after a handover (docs/restarts.md).
    if (listener_ != nullptr) listener_->Stop();
    // A stop is not held long by a collective that cannot finish (a peer gone): 5 s at most.
    const size_t moved = core_->HandOver(
        std::min(config_.handover_drain, absl::Seconds(5)),
        "railyardd is stopping (SIGTERM); its clients wait RAILYARD_RECONNECT_S for the next one "
        "on the socket (--on_stop=drain)");
    Log(LogLevel::kInfo, "daemon", "sessions sent to the next railyardd", {F("sessions", moved)});
  }
  if (handover_ != nullptr) {
    handover_->Stop();
    // Handed over, the path holds the new daemon's handover socket.
    if (!handover_->handed_over()) ::unlink(handover::HandoverPath(config_.socket).c_str());
  }
  core_->Shutdown();
  if (listener_ != nullptr) listener_->Stop();  // no new clients; removes --socket
  if (peer_grpc_ != nullptr) {
    peer_grpc_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
    peer_grpc_->Wait();
    peer_grpc_.reset();
  }
  if (grpc_ != nullptr) {
    grpc_->Shutdown(absl::ToChronoTime(absl::Now() + config_.shutdown_grace));
    grpc_->Wait();
    grpc_.reset();
  }
  if (admin_grpc_ != nullptr) {
    admin_grpc_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
    admin_grpc_->Wait();
    admin_grpc_.reset();
  }
  if (fd_channels_ != nullptr) fd_channels_->Stop();  // removes <socket>.fd
  if (socket_created_) {
    ::unlink(config_.socket.c_str());
    socket_created_ = false;
  }
  if (admin_socket_created_) {
    ::unlink(config_.admin_socket.c_str());
    admin_socket_created_ = false;
  }
  if (metrics_http_ != nullptr) {
    metrics_http_->Stop();  // scrapes read core_'s state: stop them first
    metrics_http_.reset();
  }
  local_.reset();
  admin_.reset();
  admin_refusal_.reset();
  listener_.reset();
  refusals_.reset();
  fd_channels_.reset();
  peer_.reset();
  core_.reset();
  Log(LogLevel::kInfo, "daemon", "stopped", {});
}

void Server::Reload() {
  if (core_ != nullptr) core_->fair_share().ReloadWeights();
}

}  // namespace railyard
