// Turns a SubmitRequest from the wire into a PendingRequest: enum conversion, buffer lookup and
// bounds checks, in-place layout checks. Everything a single rank can get wrong is caught here.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/comm/pending_request.h"
#include "daemon/session/session.h"
#include "railyard/v1/local.pb.h"

namespace railyard {

bool FromProto(v1::DataType in, kernels::DataType* out);
bool FromProto(v1::RedOp in, kernels::RedOp* out);
bool FromProto(v1::CollectiveOp in, scheduler::OpKind* out);

// Algorithms a request may force (RAILYARD_ALGO). Single-node communicators run every one of
// them as the same local plan.
bool ValidAlgo(absl::string_view algo);

// SubmitRequest.stream_sync's words: 8 bytes (ready, done) of a host buffer of this session,
// 4-byte aligned; NOT_FOUND / INVALID_ARGUMENT naming stream_sync.words and what is wrong.
absl::StatusOr<StreamSync> ResolveStreamSync(const v1::StreamSync& in, const Session& session);

// INVALID_ARGUMENT / NOT_FOUND with a message saying which field and why.
absl::StatusOr<std::unique_ptr<PendingRequest>> DecodeSubmit(const v1::SubmitRequest& req,
                                                             const Session& session, int rank,
                                                             int nranks);

}  // namespace railyard
