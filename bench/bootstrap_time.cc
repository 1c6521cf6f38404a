// Wall time of one communicator's bootstrap across daemons: one rank per daemon (a thread each,
// connected beforehand), all calling InitComm at once; prints the time until the last returned.
//   bootstrap_time --daemons a.sock,b.sock,... [--repeats N]
// Each repeat is a new communicator; the first on fresh daemons includes their peer channels'
// connection set-up (TLS handshakes with --peer_tls_*), the later ones reuse them.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "railyard/client.h"

ABSL_FLAG(std::string, daemons, "", "Comma-separated client sockets, one rank on each");
ABSL_FLAG(int, repeats, 1, "Communicators to bootstrap one after the other");
ABSL_FLAG(std::string, job, "bootstrap-bench", "Job id of the ranks");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<std::string> socks =
      absl::StrSplit(absl::GetFlag(FLAGS_daemons), ',', absl::SkipEmpty());
  if (socks.size() < 2) {
    std::fprintf(stderr, "bootstrap_time: --daemons needs at least two sockets\n");
    return 2;
  }
  const int n = static_cast<int>(socks.size());
  std::vector<std::unique_ptr<railyard::Client>> clients;
  for (const auto& s : socks) {
    railyard::ClientOptions o;
    o.socket = s;
    o.job = absl::GetFlag(FLAGS_job);
    auto c = railyard::Client::Connect(o);
    if (!c.ok()) {
      std::fprintf(stderr, "bootstrap_time: connect %s: %s\n", s.c_str(),
                   std::string(c.status().message()).c_str());
      return 1;
    }
    clients.push_back(*std::move(c));
  }
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    auto id = clients[0]->CreateCommId();
    if (!id.ok()) {
      std::fprintf(stderr, "bootstrap_time: %s\n", std::string(id.status().message()).c_str());
      return 1;
    }
    std::vector<railyard::Comm> comms(n);
    std::vector<absl::Status> got(n);
    std::vector<std::thread> ranks;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < n; ++r) {
      ranks.emplace_back([&, r] {
        auto m = clients[r]->InitComm(*id, r, n, std::chrono::milliseconds(60000));
        got[r] = m.status();
        if (m.ok()) comms[r] = *std::move(m);
      });
    }
    for (auto& t : ranks) t.join();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    for (int r = 0; r < n; ++r) {
      if (!got[r].ok()) {
        std::fprintf(stderr, "bootstrap_time: rank %d: %s\n", r,
                     std::string(got[r].message()).c_str());
        return 1;
      }
    }
    std::printf("bootstrap %d ranks=%d ms=%.1f\n", rep, n, ms);
    std::fflush(stdout);
    for (auto& c : comms) (void)c.Destroy();
  }
  return 0;
}
