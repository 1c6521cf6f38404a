// ucx-pingpong: latency (8 B ping-pong) and bandwidth (64 MiB, acknowledged) between two
// UcxTransport instances in two processes on this host, for a choice of UCX transports. The
// launcher spawns the echo side as a child of itself and talks to it over pipes for bootstrap.
//
//   ucx-pingpong [--tls=tcp] [--device=lo] [--busy_poll=0] [--iters=2000] [--bw_bytes=67108864]
//                [--bw_iters=5] [--exchange=512K,2M] [--exchange_iters=200] [--exchange_pieces=1]
//
// --exchange: for each size S, both processes send S bytes to each other and receive S at the
// same time, one exchange after the other (the next posted when both of a side's transfers are
// done): the traffic of a two-node AllReduce (each node must send and receive S), with nothing
// else, so its time bounds from below what any two-node AllReduce over this transport costs.
#include <fcntl.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/transport/ucx/ucx_transport.h"

ABSL_FLAG(std::string, tls, "tcp", "UCX transports (UCX_TLS) for both sides, e.g. tcp or tcp,sm");
ABSL_FLAG(std::string, device, "lo", "network device (UCX_NET_DEVICES); empty lets UCX choose");
ABSL_FLAG(int, iters, 2000, "ping-pong round trips (after 10% warm-up)");
ABSL_FLAG(int64_t, bw_bytes, int64_t{64} << 20, "bytes per bandwidth message");
ABSL_FLAG(int, bw_iters, 5, "bandwidth messages (after one warm-up)");
ABSL_FLAG(absl::Duration, busy_poll, absl::ZeroDuration(),
          "UcxTransport::Options::busy_poll for both sides, e.g. 50us");
ABSL_FLAG(std::vector<std::string>, exchange, {},
          "sizes (bytes, K/M suffixes) for the two-way exchange; empty: skip it");
ABSL_FLAG(int, exchange_iters, 200, "exchanges per size (after 10% warm-up)");
ABSL_FLAG(int, exchange_pieces, 1, "messages each exchange is cut into, all posted at once");
ABSL_FLAG(std::string, role, "", "internal: 'echo' for the spawned side");
ABSL_FLAG(int, in_fd, -1, "internal: bootstrap pipe to read");
ABSL_FLAG(int, out_fd, -1, "internal: bootstrap pipe to write");

namespace {

using railyard::transport::CompletionFn;
using railyard::transport::Endpoint;
using railyard::transport::Tag;
using railyard::transport::UcxTransport;

// Tags: ping i = 2i, pong i = 2i + 1; bandwidth message j = kBwTag + 2j, its ack kBwTag + 2j + 1.
constexpr Tag kBwTag = Tag{1} << 40;
constexpr size_t kPingBytes = 8;

std::string ReadLine(int fd) {
  std::string line;
  char ch;
  while (read(fd, &ch, 1) == 1 && ch != '\n') line.push_back(ch);
  return line;
}

bool WriteLine(int fd, const std::string& line) {
  const std::string data = line + "\n";
  return write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "ucx-pingpong: %s\n", what.c_str());
  // _exit: the progress threads may be mid-callback; skip static destructors under them.
  _exit(1);
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", status.ToString()));
}

std::unique_ptr<UcxTransport> MakeTransport(const std::string& name) {
  UcxTransport::Options options;
  options.node_name = name;
  options.rails.push_back({absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_tls)});
  options.busy_poll = absl::GetFlag(FLAGS_busy_poll);
  auto t = UcxTransport::Create(options);
  Check(t.status(), "creating the UCX transport");
  return *std::move(t);
}

std::shared_ptr<Endpoint> Bootstrap(UcxTransport& t, int in_fd, int out_fd, bool send_first) {
  std::string peer;
  if (send_first) {
    WriteLine(out_fd, *t.LocalAddress(0));
    peer = ReadLine(in_fd);
  } else {
    peer = ReadLine(in_fd);
    WriteLine(out_fd, *t.LocalAddress(0));
  }
  auto ep = t.Connect(peer, 0);
  Check(ep.status(), "connecting");
  return *ep;
}

void Wait(absl::Notification& n, const char* what) {
  if (!n.WaitForNotificationWithTimeout(absl::Seconds(120))) Die(absl::StrCat(what, " timed out"));
}

size_t ParseSize(const std::string& text) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  const std::string unit = end ? end : "";
  if (end == text.c_str()) Die(absl::StrCat("bad --exchange size '", text, "'"));
  if (unit.empty()) return n;
  if (unit == "K") return n << 10;
  if (unit == "M") return n << 20;
  if (unit == "G") return n << 30;
  Die(absl::StrCat("bad --exchange size '", text, "': use a number with K, M or G"));
}

char Pattern(bool launcher, size_t i) { return static_cast<char>(i * 131 + (launcher ? 7 : 11)); }

// Both sides run this at once: per size, exchange_iters (+10% warm-up) exchanges of `bytes`
// each way in exchange_pieces messages, the next exchange posted from the completion that ends
// the previous one (no thread hop, as the daemon's schedules complete). Returns the median time
// of an exchange per size in microseconds (as this side saw it); false in *exact if the last
// exchange's data was not the peer's pattern.
std::vector<double> RunExchanges(Endpoint& ep, bool launcher, bool* exact) {
  constexpr Tag kExTag = Tag{1} << 41;
  const int iters = absl::GetFlag(FLAGS_exchange_iters);
  const int total = iters + iters / 10;
  const int pieces = std::max(1, absl::GetFlag(FLAGS_exchange_pieces));
  std::vector<double> medians;
  *exact = true;
  int size_index = 0;
  for (const std::string& text : absl::GetFlag(FLAGS_exchange)) {
    const size_t bytes = ParseSize(text);
    std::vector<char> out(bytes), in(bytes);
    for (size_t i = 0; i < bytes; ++i) out[i] = Pattern(launcher, i);
    const size_t piece = (bytes + pieces - 1) / pieces;
    std::vector<double> us;
    us.reserve(total);
    std::atomic<int> left{0};
    absl::Time started;
    absl::Notification done;
    std::function<void(int)> post = [&](int i) {
      left.store(2 * pieces);
      started = absl::Now();
      auto finish = [&, i](const absl::Status& s) {
        Check(s, "exchange");
        if (left.fetch_sub(1) != 1) return;
        if (i >= iters / 10) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - started));
        if (i + 1 < total) {
          post(i + 1);
        } else {
          done.Notify();
        }
      };
      for (int p = 0; p < pieces; ++p) {
        const size_t off = std::min(bytes, p * piece);
        const size_t len = std::min(piece, bytes - off);
        const Tag tag = kExTag + (Tag(size_index) << 32) + Tag(i) * pieces + p;
        ep.Recv(tag, in.data() + off, len, finish);
        ep.Send(tag, out.data() + off, len, finish);
      }
    };
    post(0);
    Wait(done, "exchange");
    for (size_t i = 0; i < bytes && *exact; ++i) *exact = in[i] == Pattern(!launcher, i);
    std::sort(us.begin(), us.end());
    medians.push_back(us[us.size() / 2]);
    ++size_index;
  }
  return medians;
}

// The echo side: answers every ping with a pong from the completion callback (no thread hop),
// and every bandwidth message with an 8-byte ack.
int RunEcho(int in_fd, int out_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  auto t = MakeTransport("echo");
  std::shared_ptr<Endpoint> ep = Bootstrap(*t, in_fd, out_fd, /*send_first=*/true);
  const int iters = absl::GetFlag(FLAGS_iters);
  const int total = iters + iters / 10;
  std::vector<char> ping(kPingBytes), pong(kPingBytes, 'p');
  absl::Notification pings_done;
  std::function<void(int)> post_ping = [&](int i) {
    ep->Recv(2 * i, ping.data(), kPingBytes, [&, i](const absl::Status& s) {
      Check(s, "echo: ping");
      ep->Send(2 * i + 1, pong.data(), kPingBytes,
               [](const absl::Status& s) { Check(s, "echo: pong"); });
      if (i + 1 < total) {
        post_ping(i + 1);
      } else {
        pings_done.Notify();
      }
    });
  };
  post_ping(0);
  Wait(pings_done, "echo: ping-pong");

  const size_t bytes = absl::GetFlag(FLAGS_bw_bytes);
  std::vector<char> buf(bytes);
  char ack[8] = {};
  for (int j = 0; j <= absl::GetFlag(FLAGS_bw_iters); ++j) {
    absl::Notification got;
    ep->Recv(kBwTag + 2 * j, buf.data(), bytes, [&](const absl::Status& s) {
      Check(s, "echo: bandwidth message");
      ep->Send(kBwTag + 2 * j + 1, ack, sizeof(ack),
               [](const absl::Status& s) { Check(s, "echo: ack"); });
      got.Notify();
    });
    Wait(got, "echo: bandwidth message");
  }
  // Hand the last message back so the launcher can check it byte for byte.
  absl::Notification returned;
  ep->Send(kBwTag - 1, buf.data(), bytes, [&](const absl::Status& s) {
    Check(s, "echo: return");
    returned.Notify();
  });
  Wait(returned, "echo: return");
  bool exact = true;
  RunExchanges(*ep, /*launcher=*/false, &exact);
  if (!exact) Die("echo: exchanged data is not the launcher's");
  ReadLine(in_fd);  // until the launcher is done with us
  return 0;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

int RunLauncher(const char* self) {
  int to_echo[2], from_echo[2];
  if (pipe(to_echo) != 0 || pipe(from_echo) != 0) Die("pipe failed");
  std::vector<std::string> args = {
      self,
      "--role=echo",
      absl::StrCat("--in_fd=", to_echo[0]),
      absl::StrCat("--out_fd=", from_echo[1]),
      absl::StrCat("--tls=", absl::GetFlag(FLAGS_tls)),
      absl::StrCat("--device=", absl::GetFlag(FLAGS_device)),
      absl::StrCat("--iters=", absl::GetFlag(FLAGS_iters)),
      absl::StrCat("--bw_bytes=", absl::GetFlag(FLAGS_bw_bytes)),
      absl::StrCat("--bw_iters=", absl::GetFlag(FLAGS_bw_iters)),
      absl::StrCat("--exchange=", absl::StrJoin(absl::GetFlag(FLAGS_exchange), ",")),
      absl::StrCat("--exchange_iters=", absl::GetFlag(FLAGS_exchange_iters)),
      absl::StrCat("--exchange_pieces=", absl::GetFlag(FLAGS_exchange_pieces)),
      absl::StrCat("--busy_poll=", absl::FormatDuration(absl::GetFlag(FLAGS_busy_poll)))};
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclose(&actions, to_echo[1]);
  posix_spawn_file_actions_addclose(&actions, from_echo[0]);
  pid_t child;
  if (posix_spawn(&child, "/proc/self/exe", &actions, nullptr, argv.data(), environ) != 0) {
    Die("cannot spawn the echo process");
  }
  posix_spawn_file_actions_destroy(&actions);
  close(to_echo[0]);
  close(from_echo[1]);

  auto t = MakeTransport("launcher");
  std::shared_ptr<Endpoint> ep = Bootstrap(*t, from_echo[0], to_echo[1], /*send_first=*/false);

  // Latency: one round trip at a time, the next ping posted from the pong's completion.
  const int iters = absl::GetFlag(FLAGS_iters);
  const int warmup = iters / 10;
  const int total = iters + warmup;
  std::vector<char> ping(kPingBytes, 'x'), pong(kPingBytes);
  std::vector<double> rtt_us;
  rtt_us.reserve(iters);
  absl::Time sent_at;
  absl::Notification pongs_done;
  std::function<void(int)> round = [&](int i) {
    ep->Recv(2 * i + 1, pong.data(), kPingBytes, [&, i](const absl::Status& s) {
      Check(s, "pong");
      if (i >= warmup) rtt_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - sent_at));
      if (i + 1 < total) {
        round(i + 1);
      } else {
        pongs_done.Notify();
      }
    });
    sent_at = absl::Now();
    ep->Send(2 * i, ping.data(), kPingBytes, [](const absl::Status& s) { Check(s, "ping"); });
  };
  round(0);
  Wait(pongs_done, "ping-pong");

  // Bandwidth: one message at a time, timed from posting to the echo's ack.
  const size_t bytes = absl::GetFlag(FLAGS_bw_bytes);
  std::vector<char> buf(bytes);
  for (size_t i = 0; i < bytes; ++i) buf[i] = static_cast<char>(i * 131 + 7);
  char ack[8];
  std::vector<double> gbps;
  for (int j = 0; j <= absl::GetFlag(FLAGS_bw_iters); ++j) {
    absl::Notification acked;
    ep->Recv(kBwTag + 2 * j + 1, ack, sizeof(ack), [&](const absl::Status& s) {
      Check(s, "ack");
      acked.Notify();
    });
    const absl::Time start = absl::Now();
    ep->Send(kBwTag + 2 * j, buf.data(), bytes,
             [](const absl::Status& s) { Check(s, "bandwidth send"); });
    Wait(acked, "bandwidth");
    if (j > 0) gbps.push_back(bytes / absl::ToDoubleSeconds(absl::Now() - start) / 1e9);
  }
  std::vector<char> back(bytes);
  absl::Notification returned;
  ep->Recv(kBwTag - 1, back.data(), bytes, [&](const absl::Status& s) {
    Check(s, "return");
    returned.Notify();
  });
  Wait(returned, "return");
  bool exact = back == buf;
  bool exchanged_exact = true;
  const std::vector<double> exchange_us = RunExchanges(*ep, /*launcher=*/true, &exchanged_exact);
  exact = exact && exchanged_exact;

  WriteLine(to_echo[1], "done");
  int status = 0;
  waitpid(child, &status, 0);

  double sum = 0;
  for (double g : gbps) sum += g;
  std::printf(
      "tls=%s device=%s busy_poll=%s: 8 B round trip: median %.1f us, p99 %.1f us (one-way ~%.1f "
      "us, %d "
      "iters); %zu B messages: best %.2f GB/s, mean %.2f GB/s (%zu iters); data %s\n",
      absl::GetFlag(FLAGS_tls).c_str(), absl::GetFlag(FLAGS_device).c_str(),
      absl::FormatDuration(absl::GetFlag(FLAGS_busy_poll)).c_str(), Percentile(rtt_us, 0.5),
      Percentile(rtt_us, 0.99), Percentile(rtt_us, 0.5) / 2, iters, bytes,
      *std::max_element(gbps.begin(), gbps.end()), sum / gbps.size(), gbps.size(),
      exact ? "byte-exact" : "CORRUPT");
  const std::vector<std::string>& sizes = absl::GetFlag(FLAGS_exchange);
  for (size_t i = 0; i < exchange_us.size(); ++i) {
    const double bytes = static_cast<double>(ParseSize(sizes[i]));
    std::printf("exchange %.0f B each way in %d message(s): median %.2f us (%.2f GB/s each way)\n",
                bytes, std::max(1, absl::GetFlag(FLAGS_exchange_pieces)), exchange_us[i],
                bytes / exchange_us[i] / 1e3);
  }
  return exact && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // The tcp segment sizes railyardd sets at start-up (the echo inherits them through environ).
  for (const std::string& set : railyard::transport::SetUcxTcpDefaults()) {
    if (absl::GetFlag(FLAGS_role).empty()) std::printf("# %s\n", set.c_str());
  }
  if (absl::GetFlag(FLAGS_role) == "echo") {
    return RunEcho(absl::GetFlag(FLAGS_in_fd), absl::GetFlag(FLAGS_out_fd));
  }
  return RunLauncher(argv[0]);
}
