#include "daemon/transport/ucx/ucx_transport.h"

#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "daemon/transport/ucx/ucx_address.h"
#include "daemon/transport/ucx/ucx_rail.h"

namespace railyard::transport {
namespace {

absl::Status CheckRail(int rail, int num_rails) {
  if (rail >= 0 && rail < num_rails) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "rail ", rail, " is out of range: this transport has rails [0, ", num_rails, ")"));
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

// A handle on one peer of one rail. The rail owns the UCX state; this only names it.
class UcxEndpoint : public Endpoint {
 public:
  UcxEndpoint(std::shared_ptr<UcxRail> rail, uint64_t peer) : rail_(std::move(rail)), peer_(peer) {}
  ~UcxEndpoint() override { rail_->Release(peer_); }

  void SendV(Tag tag, const Segment* segments, int count, CompletionFn done) override {
    rail_->SendV(peer_, tag, segments, count, std::move(done));
  }
  void RecvV(Tag tag, const Segment* segments, int count, RecvCompletionFn done) override {
    rail_->RecvV(peer_, tag, segments, count, std::move(done));
  }
  void Abort(const absl::Status& status) override { rail_->Abort(peer_, status); }

 private:
  const std::shared_ptr<UcxRail> rail_;
  const uint64_t peer_;
};

}  // namespace

std::vector<std::string> SetUcxTcpDefaults() {
  // TX must not exceed RX: UCX refuses the context otherwise. Both or neither are ours, so an
  // operator who sets one does not get a pair UCX refuses.
  static constexpr const char* kNames[] = {"UCX_TCP_RX_SEG_SIZE", "UCX_TCP_TX_SEG_SIZE"};
  static constexpr const char* kValue = "512K";
  std::vector<std::string> set;
  for (const char* name : kNames) {
    if (std::getenv(name) != nullptr) return set;
  }
  for (const char* name : kNames) {
    if (setenv(name, kValue, /*overwrite=*/0) == 0) set.push_back(absl::StrCat(name, "=", kValue));
  }
  return set;
}

bool RailTlsIsTcpOnly(const std::string& tls) {
  bool tcp = false;
  for (absl::string_view name : absl::StrSplit(tls, ',')) {
    name = absl::StripAsciiWhitespace(name);
    if (name == "tcp") {
      tcp = true;
    } else if (name != "self" && name != "sm" && name != "shm" && name != "posix" &&
               name != "sysv" && name != "cma" && name != "knem" && name != "xpmem") {
      return false;
    }
  }
  return tcp;
}

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(Options options) {
  if (options.rails.empty()) {
    return absl::InvalidArgumentError("UcxTransport needs at least one rail in its options");
  }
  const std::string node =
      SanitizeUcxLabel(options.node_name.empty() ? HostName() : options.node_name);
  std::vector<std::shared_ptr<UcxRail>> rails;
  for (size_t i = 0; i < options.rails.size(); ++i) {
    UcxRail::Config config;
    config.index = static_cast<int>(i);
    config.rail = options.rails[i];
    config.label = absl::StrCat(node, "/rail", i);
    config.shutdown_timeout = options.shutdown_timeout;
    config.cancel_grace = options.cancel_grace;
    config.connect_timeout = options.connect_timeout;
    config.busy_poll = options.busy_poll;
    config.tcp_congestion = options.tcp_congestion;
    config.report = options.report;
    absl::StatusOr<std::shared_ptr<UcxRail>> rail = UcxRail::Create(std::move(config));
    if (!rail.ok()) {
      for (auto& r : rails) r->StopAndWait();
      return rail.status();
    }
    rails.push_back(*std::move(rail));
  }
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(rails)));
}

UcxTransport::UcxTransport(std::vector<std::shared_ptr<UcxRail>> rails)
    : rails_(std::move(rails)) {}

UcxTransport::~UcxTransport() { Shutdown(); }

absl::StatusOr<std::string> UcxTransport::LocalAddress(int rail) {
  if (absl::Status s = CheckRail(rail, num_rails()); !s.ok()) return s;
  return rails_[rail]->address();
}

absl::StatusOr<std::shared_ptr<Endpoint>> UcxTransport::Connect(const std::string& peer_address,
                                                                int rail) {
  if (absl::Status s = CheckRail(rail, num_rails()); !s.ok()) return s;
  absl::StatusOr<uint64_t> peer = rails_[rail]->Connect(peer_address);
  if (!peer.ok()) return peer.status();
  return std::make_shared<UcxEndpoint>(rails_[rail], *peer);
}

void UcxTransport::Shutdown() {
  // Stop every rail at once so that the bounded drains overlap.
  for (auto& rail : rails_) rail->RequestStop();
  for (auto& rail : rails_) rail->StopAndWait();
}

void UcxTransport::BeginPolling() {
  for (auto& rail : rails_) rail->BeginPolling();
}

bool UcxTransport::Poll() {
  bool any = false;
  for (auto& rail : rails_) any = rail->Poll() || any;
  return any;
}

void UcxTransport::EndPolling() {
  for (auto& rail : rails_) rail->EndPolling();
}

}  // namespace railyard::transport
