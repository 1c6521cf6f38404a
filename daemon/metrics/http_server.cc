#include "daemon/metrics/http_server.h"

#include <civetweb.h>

#include <cstring>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/metrics/exposition.h"

namespace railyard::metrics {
namespace {

void Reply(mg_connection* conn, int code, std::string_view content_type, std::string_view body) {
  mg_response_header_start(conn, code);
  mg_response_header_add(conn, "Content-Type", content_type.data(),
                         static_cast<int>(content_type.size()));
  const std::string length = absl::StrCat(body.size());
  mg_response_header_add(conn, "Content-Length", length.c_str(), -1);
  mg_response_header_add(conn, "Cache-Control", "no-store", -1);
  mg_response_header_send(conn);
  mg_write(conn, body.data(), body.size());
}

bool IsGet(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  return info != nullptr && info->request_method != nullptr &&
         (std::strcmp(info->request_method, "GET") == 0 ||
          std::strcmp(info->request_method, "HEAD") == 0);
}

}  // namespace

HttpServer::HttpServer(const Registry* registry, std::function<bool()> ready)
    : registry_(registry), ready_(std::move(ready)) {}

HttpServer::~HttpServer() { Stop(); }

absl::StatusOr<std::string> HttpServer::Start(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen '", listen, "' is not host:port"));
  }
  std::string host = listen.substr(0, colon);
  // civetweb takes "ip:port", "[ipv6]:port" or a bare port for every interface.
  const std::string ports =
      host.empty() || host == "0.0.0.0" ? absl::StrCat(port) : absl::StrCat(host, ":", port);
  static std::once_flag init;
  std::call_once(init, [] { mg_init_library(0); });
  const char* options[] = {"listening_ports",    ports.c_str(), "num_threads", "2",
                           "request_timeout_ms", "10000",       nullptr};
  mg_callbacks callbacks{};
  ctx_ = mg_start(&callbacks, this, options);
  if (ctx_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, " (address in use or not local?)"));
  }
  mg_set_request_handler(ctx_, "/metrics$", &HandleMetrics, this);
  mg_set_request_handler(ctx_, "/healthz$", &HandleHealth, this);
  mg_set_request_handler(ctx_, "/readyz$", &HandleReady, this);
  mg_server_port bound[4] = {};
  const int n = mg_get_server_ports(ctx_, 4, bound);
  if (n < 1 || bound[0].port <= 0) {
    Stop();
    return absl::UnavailableError(absl::StrCat("metrics server on ", listen, " bound no port"));
  }
  if (host.empty() || host == "0.0.0.0") host = "0.0.0.0";
  return absl::StrCat(host, ":", bound[0].port);
}

void HttpServer::Stop() {
  if (ctx_ == nullptr) return;
  mg_stop(ctx_);
  ctx_ = nullptr;
}

int HttpServer::HandleMetrics(mg_connection* conn, void* self) {
  if (!IsGet(conn)) {
    Reply(conn, 405, "text/plain", "only GET\n");
    return 405;
  }
  const std::string body = RenderText(*static_cast<HttpServer*>(self)->registry_);
  Reply(conn, 200, kTextContentType, body);
  return 200;
}

int HttpServer::HandleHealth(mg_connection* conn, void* /*self*/) {
  Reply(conn, 200, "text/plain", "ok\n");
  return 200;
}

int HttpServer::HandleReady(mg_connection* conn, void* self) {
  const auto* server = static_cast<HttpServer*>(self);
  if (server->ready_ && server->ready_()) {
    Reply(conn, 200, "text/plain", "ready\n");
    return 200;
  }
  Reply(conn, 503, "text/plain", "not ready\n");
  return 503;
}

}  // namespace railyard::metrics
