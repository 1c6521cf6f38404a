// railyard.v1.Admin as the client socket serves it: to nobody. Tenants connect there, and Admin
// shows every job on the node, so every Admin call there — whatever its method, including ones
// added to admin.proto later — is PERMISSION_DENIED saying where operators find it
// (--admin_socket) instead of gRPC's bare UNIMPLEMENTED. A generic service answers every method
// the client socket does not serve: Admin's are refused, anything else is UNIMPLEMENTED naming it.
#pragma once

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/support/server_callback.h"

namespace railyard {

class AdminRefusal final : public grpc::CallbackGenericService {
 public:
  static constexpr const char* kAdminPrefix = "/railyard.v1.Admin/";

  explicit AdminRefusal(std::string admin_socket)
      : why_(absl::StrCat("Admin is not served on the client socket, which tenants share; "
                          "operators use the admin socket ",
                          std::move(admin_socket), " (--admin_socket, mode 0600)")) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    const std::string& method = ctx->method();
    if (absl::StartsWith(method, kAdminPrefix)) {
      return new Refusal(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                      absl::StrCat(method.substr(1), ": ", why_)));
    }
    return new Refusal(
        grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                     absl::StrCat("railyardd's client socket serves railyard.v1.Local, not ",
                                  method.substr(0, 200))));
  }

 private:
  // Answers at once, without reading the request.
  class Refusal final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Refusal(grpc::Status status) { Finish(std::move(status)); }
    void OnDone() override { delete this; }
  };
  const std::string why_;
};

}  // namespace railyard
