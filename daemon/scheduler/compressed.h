// The compressed AllReduce: what runs when an AllReduce across nodes asks for a lossy codec
// (docs/compression.md). It is a node-level schedule, not a rank schedule, because encoding is a
// node's business: the node's ranks are reduced exactly in float32 first, and only what crosses
// the fabric is compressed.
//
// The element range is cut into one shard per node; node o owns shard o. Each shard is cut into
// units of about chunk_bytes (whole int8 blocks), unit k of a shard going over rail k % rails.
//   1. local:   P[u] = sum of the node's ranks' send[u] (exact, float32 scratch)
//   2. reduce-scatter, direct: a non-owner encodes P[u] once, with error feedback, and sends it
//      to the owner; the owner decodes and adds every peer's contribution into its own P[u] in
//      float32 (its own contribution is never compressed)
//   3. all-gather: the owner encodes the reduced P[u] once (with its own residual), decodes that
//      same message into its own P[u], and sends the message to every other node, which decodes
//      it: every rank of every node ends with the same bits
//   4. local:   recv[u] of every local rank = P[u] (divided by nranks for avg)
// Every value is compressed exactly twice whatever N is: once as one node's contribution and once
// as the reduced result. Per element, |error| <= sum over the N-1 other nodes of their codec
// error + the codec error of the result (int8: scale/2 each, the scale of its block), against
// N-1 successive re-compressions of growing partial sums on a ring.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "daemon/kernels/codec.h"
#include "daemon/kernels/types.h"
#include "daemon/scheduler/op.h"
#include "daemon/scheduler/schedule.h"

namespace railyard::scheduler {

inline constexpr const char* kAlgoCompressed = "compressed";

// True when an operation of this kind runs compressed under a codec other than none: AllReduce
// or ReduceScatter of float32, float16 or bfloat16 with sum or avg across more than one node.
// 16-bit data is widened to float32 for the node's partial and the codecs, and rounded back once at
// the end. Elsewhere a codec does not apply and the operation runs exact (like NCCL's env knobs, a
// setting that does not apply changes nothing).
bool CompressionApplies(OpKind op, kernels::DataType dtype, kernels::RedOp red_op, int nnodes);

// Node `node`'s steps of the compressed AllReduce of `count` elements of dtype. chunk_bytes: the
// float32 bytes of one unit (0: one unit per shard and rail). INVALID_ARGUMENT for a codec of
// none, a one-node layout, a dtype CompressionApplies refuses, or a count whose units would not
// fit the tag space.
absl::StatusOr<NodeSchedule> BuildCompressedAllReduce(const CommLayout& layout, int node,
                                                      uint64_t count, kernels::DataType dtype,
                                                      const kernels::Codec& codec,
                                                      size_t chunk_bytes);

// The compressed ReduceScatter: the reduce-scatter half of the AllReduce above, with the ranks'
// outputs as the shards (rank r's, count elements from r * count, owned by r's node). Non-owners
// encode their partial of a shard once, with error feedback, and send it to the owner, which
// decodes and adds every contribution into its exact partial and writes rank r's output. Each
// element is compressed once per other node and never on its owner: |error| <= sum over the N-1
// other nodes of their codec error. Same arguments and refusals as BuildCompressedAllReduce,
// count being each rank's output.
absl::StatusOr<NodeSchedule> BuildCompressedReduceScatter(const CommLayout& layout, int node,
                                                          uint64_t count, kernels::DataType dtype,
                                                          const kernels::Codec& codec,
                                                          size_t chunk_bytes);

// Runs one kEncode, kDecode or kDecodeAdd step of n float32 elements from src to dst: what NodeRun
// and the symbolic executor both execute. residual: the step's slice of its key's residual (the
// encode adds it in and updates it), null for no feedback. A decode of malformed bytes returns the
// codec's INVALID_ARGUMENT and leaves nothing outside dst's n elements touched.
absl::Status RunCodecStep(NodeStep::Kind kind, const kernels::Codec& codec, const std::byte* src,
                          std::byte* dst, size_t n, float* residual);

// Runs one kWiden, kWidenAdd or kNarrow step of n elements between dtype data and the float32
// partial: what NodeRun and the symbolic executor both execute. divisor: nranks for a finalizing
// narrow of an avg, else 1.
void RunConvertStep(NodeStep::Kind kind, kernels::DataType dtype, const std::byte* src,
                    std::byte* dst, size_t n, uint32_t divisor);

}  // namespace railyard::scheduler
