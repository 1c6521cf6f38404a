// gRPC railyard.v1.Local: translates calls into DaemonCore operations (callback API: no handler
// blocks a thread while it waits for other ranks).
#pragma once

#include "daemon/core/daemon_core.h"
#include "daemon/services/grpc_status.h"
#include "railyard/v1/local.grpc.pb.h"

namespace railyard {

class LocalService final : public v1::Local::CallbackService {
 public:
  explicit LocalService(DaemonCore* core) : core_(core) {}

  grpc::ServerWriteReactor<v1::SessionEvent>* Connect(grpc::CallbackServerContext* ctx,
                                                      const v1::ConnectRequest* req) override;
  grpc::ServerUnaryReactor* RegisterBuffer(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterBufferRequest* req,
                                           v1::RegisterBufferResponse* resp) override;
  grpc::ServerUnaryReactor* ReleaseBuffer(grpc::CallbackServerContext* ctx,
                                          const v1::ReleaseBufferRequest* req,
                                          v1::ReleaseBufferResponse* resp) override;
  grpc::ServerUnaryReactor* CreateCommId(grpc::CallbackServerContext* ctx,
                                         const v1::CreateCommIdRequest* req,
                                         v1::CreateCommIdResponse* resp) override;
  grpc::ServerUnaryReactor* InitComm(grpc::CallbackServerContext* ctx,
                                     const v1::InitCommRequest* req,
                                     v1::InitCommResponse* resp) override;
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx, const v1::SubmitRequest* req,
                                   v1::SubmitResponse* resp) override;
  grpc::ServerUnaryReactor* OpenRings(grpc::CallbackServerContext* ctx,
                                      const v1::OpenRingsRequest* req,
                                      v1::OpenRingsResponse* resp) override;
  grpc::ServerUnaryReactor* CommCensus(grpc::CallbackServerContext* ctx,
                                       const v1::CommCensusRequest* req,
                                       v1::CommCensusResponse* resp) override;
  grpc::ServerUnaryReactor* DestroyComm(grpc::CallbackServerContext* ctx,
                                        const v1::DestroyCommRequest* req,
                                        v1::DestroyCommResponse* resp) override;
  grpc::ServerUnaryReactor* Disconnect(grpc::CallbackServerContext* ctx,
                                       const v1::DisconnectRequest* req,
                                       v1::DisconnectResponse* resp) override;

 private:
  DaemonCore* core_;
};

}  // namespace railyard
