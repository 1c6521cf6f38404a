// The Transport between daemons over UCX: one UCX context and worker per rail (NIC), tagged
// sends and receives of whole chunks, and a progress thread per worker that sleeps on the
// worker's event fd when there is nothing to do (no CPU when idle).
//
// Threading. Every UCX call of a rail happens on the thread that owns the rail (holds its owner
// mutex): the progress thread, or a thread that polls (Transport::Poll), and the worker runs in
// UCS_THREAD_MODE_SERIALIZED, which that mutex guarantees. Send, Recv, Abort and Connect enqueue
// a command; the owner runs it. The progress thread is woken for it through an eventfd only when
// it sleeps and no polling thread is registered to run it. We chose this funnel over
// UCS_THREAD_MODE_MULTI with direct posting because MULTI serialises every call on one worker
// lock anyway, and because an endpoint that one thread closes (on Abort or peer failure) must
// never be used by another, which direct posting could only guarantee with a lock of our own
// around every UCX call. One owner at a time also keeps the per-endpoint bookkeeping (the
// operations to fail on Abort or peer failure) free of further locks. The cost is one queue
// hand-off per operation: a mutex, plus an eventfd write when the progress thread sleeps.
//
// Completion callbacks run on the rail's owner, inside UCX progress. They must not block (no
// waiting for other operations, no locks held for long, no Shutdown()): while one runs, nothing
// else on that rail makes progress. Posting more work from a callback is fine.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/transport/tcp_congestion.h"
#include "daemon/transport/transport.h"

namespace railyard::transport {

class UcxRail;

// Settings of UCX's tcp transport the daemon uses unless the operator set them: segments of
// 512 KiB (UCX_TCP_RX_SEG_SIZE, UCX_TCP_TX_SEG_SIZE) instead of 64 KiB received and 8 KiB sent
// per system call. A rendezvous travels in fragments of one segment, each a sendmsg() on one side
// and a recv() on the other; measured on the development VM, a 512 KiB AllReduce between two
// daemons made ~34 data-path system calls per daemon with UCX's sizes and ~12 with these, and 2
// and 8 MiB ran ~1.7x faster (docs/data-plane.md). Sets them in the process environment, where
// UCX reads its configuration (a variable already set wins), and returns what it set as
// "NAME=VALUE". Call it once at start-up, before any other thread runs: setenv() is not
// thread-safe. The segment size is also where UCX's tcp rendezvous starts, and the frame's
// split threshold (transport::kDefaultSplitMinBytes, part of the wire format) sits there on
// purpose; it does not follow a segment size an operator sets, so change the two together.
std::vector<std::string> SetUcxTcpDefaults();

// The zero-copy threshold (UCX_ZCOPY_THRESH) of a rail whose UCX_TLS is tcp alone (tcp, with or
// without self and the shared-memory names: RailTlsIsTcpOnly), unless the operator set
// UCX_ZCOPY_THRESH: from 64 KiB an eager send goes straight from the caller's memory (a sendmsg
// over its iov; tcp registers nothing) instead of being packed into UCX's buffer first. UCX's own
// choice on tcp packs every eager message up to the rendezvous (512 KiB with the segments
// above), so a frame (payload and trailer, FramedEndpoint) cost a copy of its payload per send.
// Measured between two daemons on lo, AllReduce float32, interleaved launches, medians of the
// daemons' CPU per operation, the copy against the iov sent zero-copy: 512 KiB 483 -> 421 us,
// 2 MiB 1402 -> 1290 us, 8 MiB 6044 -> 5368 us, 32 MiB 30.2 -> 26.5 ms (docs/data-plane.md,
// "Frames as an iov, sent zero-copy"). Set per rail (ucp_config_modify),
// not in the environment, so a rail on another transport keeps UCX's threshold.
inline constexpr const char* kUcxTcpZcopyThresh = "64K";
// True when every name in the comma-separated UCX_TLS value `tls` is tcp, self or a
// shared-memory transport (sm, shm, posix, sysv, cma, knem, xpmem), and tcp is among them.
bool RailTlsIsTcpOnly(const std::string& tls);

class UcxTransport : public Transport {
 public:
  struct Rail {
    // Network interface this rail's traffic uses (UCX_NET_DEVICES), e.g. "veth-r0" or "lo";
    // empty lets UCX choose among all devices.
    std::string device;
    // UCX transports (UCX_TLS), e.g. "tcp", or "rc,tcp" on an RDMA NIC. "tcp,sm" is accepted
    // but, in UCX 1.13, buys nothing: endpoints use UCP_ERR_HANDLING_MODE_PEER (a dead peer must
    // fail operations, not hang them), and no shared-memory transport supports it there
    // (sysv/posix: "no peer failure handler"; cma: no active messages), so UCX picks tcp alone.
    // Measured between two processes on one host (tools/ucx-pingpong): the same lanes, so the
    // same numbers as "tcp" within noise (64 MiB at 1.0-4.1 GB/s on a shared 2-vCPU VM).
    std::string tls = "tcp";
    // The link's rate in bytes per second (the topology's speed_gbps); 0 when unknown. Sets how
    // long event moderation may hold the progress thread (ucx_rail.cc: what the link moves in
    // that time must fit the sockets' buffers); unknown or fast links are not moderated.
    double speed_bytes_per_s = 0;
  };

  struct Options {
    // One entry per rail; rail i of this transport uses rails[i]. At least one.
    std::vector<Rail> rails;
    // Names this daemon in its addresses, so that peers' errors say who failed ("node-a/rail0").
    // Empty: the host name.
    std::string node_name;
    // Shutdown waits at most this long per rail for UCX to hand back buffers of cancelled
    // operations before failing them anyway.
    absl::Duration shutdown_timeout = absl::Seconds(2);
    // After Abort or a peer failure, a receive that UCX had already matched (a multi-fragment
    // message half arrived) cannot be cancelled; it is failed after this grace period even if UCX
    // still holds it, so that no wait is unbounded. UCX may write into such a buffer afterwards
    // only if the aborted peer is alive and keeps sending that message.
    absl::Duration cancel_grace = absl::Seconds(1);
    // Connect waits at most this long for the progress thread to create the endpoint.
    absl::Duration connect_timeout = absl::Seconds(10);
    // After each burst of activity a progress thread keeps polling this long before it arms the
    // worker and sleeps in epoll_wait. Spinning costs CPU only right after traffic, never when
    // idle. Measured with tools/ucx-pingpong (two processes, tcp on lo, shared 2-vCPU VM): 8 B
    // round trip ~85-120 us sleeping on a quiet host (the VM's wake-up latency; ucx_perftest
    // -E sleep is the same) and ~8-10 us with 50us; but with other work on both vCPUs spinning
    // steals the peer thread's core and 50us gave ~115 us where sleeping gave ~12 us. Hence off
    // by default; turn it on where the daemon has a core to itself.
    absl::Duration busy_poll = absl::ZeroDuration();
    // The TCP congestion control of the sockets UCX's tcp transport opens for the rails
    // (tcp_congestion.h): by default a socket on bbr gets cubic, else reno.
    TcpCongestionPolicy tcp_congestion;
    // Receives what applying it did, once per rail and outcome (the daemon logs it): warning
    // false for a change, true for sockets that kept an algorithm against the policy. Called
    // on the rail's progress thread. Null: nothing is reported.
    std::function<void(bool warning, const std::string& message)> report;
  };

  // Creates every rail's UCX context, worker and progress thread. Errors, naming the rail:
  // INVALID_ARGUMENT for options without rails or a setting UCX rejects; UNAVAILABLE when UCX
  // finds no usable transport for a rail (a device that does not exist, an unknown tls name).
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(Options options);

  ~UcxTransport() override;  // Shutdown()
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  int num_rails() const override { return static_cast<int>(rails_.size()); }
  // INVALID_ARGUMENT for a rail out of range.
  absl::StatusOr<std::string> LocalAddress(int rail) override;
  // INVALID_ARGUMENT for a rail out of range or an address LocalAddress did not produce;
  // FAILED_PRECONDITION after Shutdown; UNAVAILABLE when UCX cannot reach the peer's worker from
  // this rail (no common transport, or a local peer that refuses the connection at once). A
  // dead peer is otherwise reported by the endpoint's operations (UNAVAILABLE).
  //
  // Destroying the returned endpoint cancels its pending operations (CANCELLED) and closes the
  // UCX endpoint. After Shutdown, the endpoint's operations fail with CANCELLED on the calling
  // thread (there is no progress thread left to run them).
  absl::StatusOr<std::shared_ptr<Endpoint>> Connect(const std::string& peer_address,
                                                    int rail) override;
  // Fails pending operations with CANCELLED, closes endpoints and joins the progress threads.
  // Bounded by options.shutdown_timeout (+ slack) per rail, run in parallel. Idempotent.
  void Shutdown() override;

  // Polling (see Transport): while a thread is registered, a rail's progress thread sleeps
  // without arming the worker (so traffic does not wake it) and wakes at least every
  // millisecond, so a registered thread that stops polling delays other work by at most that.
  void BeginPolling() override;
  bool Poll() override;
  void EndPolling() override;

 private:
  explicit UcxTransport(std::vector<std::shared_ptr<UcxRail>> rails);

  std::vector<std::shared_ptr<UcxRail>> rails_;
};

}  // namespace railyard::transport
