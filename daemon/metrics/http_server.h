// The metrics endpoint: an embedded civetweb server answering
//   GET /metrics  the registry in the Prometheus text format,
//   GET /healthz  200 while the process runs (liveness),
//   GET /readyz   200 once the daemon serves its gRPC APIs, else 503 (readiness).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/metrics/registry.h"

struct mg_context;
struct mg_connection;

namespace railyard::metrics {

class HttpServer {
 public:
  // ready: what /readyz reports (called per request; must be cheap and thread-safe).
  HttpServer(const Registry* registry, std::function<bool()> ready);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Listens on "host:port" (port 0: a free port). INVALID_ARGUMENT for a malformed address,
  // UNAVAILABLE when it cannot bind. Returns the bound "host:port".
  absl::StatusOr<std::string> Start(const std::string& listen);
  // Stops serving (waits for requests in progress). Idempotent.
  void Stop();

 private:
  static int HandleMetrics(mg_connection* conn, void* self);
  static int HandleHealth(mg_connection* conn, void* self);
  static int HandleReady(mg_connection* conn, void* self);

  const Registry* registry_;
  std::function<bool()> ready_;
  mg_context* ctx_ = nullptr;
};

}  // namespace railyard::metrics
