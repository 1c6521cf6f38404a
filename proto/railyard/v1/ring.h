// The session rings: the shared-memory fast path of the Local API (docs/local-api.md, "Rings").
// One memfd per session holds a submission ring (client -> daemon) and a completion ring
// (daemon -> client). The client creates it (memfd, sealed against shrinking and growing, like a
// buffer), passes it over the side channel (PUT) and names it in Local.OpenRings; from then on a
// Submit is one ring entry and its outcome one completion entry, with no RPC and no thread
// between them.
//
//   offset 0      header (kHeaderBytes): magic, geometry, and the indices and doorbells below
//   kHeaderBytes  submission ring: sq_entries slots of kSqEntryBytes
//   then          completion ring: cq_entries slots of kCqEntryBytes
//
// Indices count slots from 0 and never wrap (u64); slot i lives at i % entries. Each index has one
// writer: sq_tail and cq_head the client, sq_head and cq_tail the daemon. The daemon never trusts
// what the client wrote: it keeps its own copies of the indices it writes, reads the client's
// with bounds (a tail more than sq_entries ahead of its head is refused), copies every entry out
// of the shared memory before it looks at it, and validates the copy exactly as a gRPC Submit.
//
// Doorbells are futex words (not private: the mapping is shared across processes):
//   sq_doorbell: the client adds 1 after publishing entries (sq_tail) or consuming completions
//     (cq_head), then FUTEX_WAKEs it when daemon_sleeping is set. The daemon spins for
//     --spin_us after its last entry, then sets daemon_sleeping and FUTEX_WAITs on it.
//   cq_doorbell: the daemon adds 1 after publishing completions (cq_tail) and FUTEX_WAKEs it
//     when client_waiters is non-zero. A client thread spins for RAILYARD_SPIN_US, then adds
//     itself to client_waiters and FUTEX_WAITs on it.
// A waiter loads the doorbell before it checks its ring for the last time, and FUTEX_WAIT
// returns at once if the doorbell moved since: no wake-up is lost.
//
// Submission entry (kSqEntryBytes, little-endian): the fields of SubmitRequest.
//    0 u64 request_id     8 u64 comm_handle    16 u64 count
//   24 u64 send.buffer_id 32 u64 send.offset   40 u64 recv.buffer_id  48 u64 recv.offset
//   56 u32 op (CollectiveOp)   60 u32 dtype (DataType)   64 u32 red_op (RedOp)   68 i32 root
//   72 u32 timeout_ms    76 u32 flags (kFlagGroupNext, kFlagErrorFeedback)
//   80 u32 ext_slots: slots right after this one (wrapping) that hold the AllToAllv vectors
//   84 u32 vec_len: entries in each vector (the communicator's nranks)
//   88 char algo[16], NUL-padded     104 char compression[16], NUL-padded
//  120 u64 compression_key (0 unless kFlagErrorFeedback)
// The AllToAllv vectors follow in the ext_slots slots as one array of u64: send_counts,
// send_displs, recv_counts, recv_displs, vec_len each (ext_slots = ceil(32 vec_len / 128)).
// With kFlagStreamSync one more slot ends the extension: SubmitRequest.stream_sync as
//    0 u64 words.buffer_id    8 u64 words.offset    16 u32 value    (the rest zero)
//
// Completion entry (kCqEntryBytes):
//    0 u64 request_id    8 u64 seq    16 i32 code (google.rpc.Code)   20 u32 message_len
//   24 u32 flags (kCqFlagMoved)   28 u32 reserved   32 message bytes (at most kCqMessageBytes)
//
// Back-pressure: the daemon takes a submission only while it can promise its completion a slot
// (completions unread + accepted requests not yet completed < cq_entries), so the completion
// ring never overflows; a client that does not read completions stops being served and its
// submission ring fills. Header-only: shared by the daemon and the C++ client; the Python client
// (railyard/_ring.py) speaks the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace railyard::ringproto {

inline constexpr uint32_t kMagic = 0x47525952;  // "RYRG" read as little-endian bytes
inline constexpr uint32_t kVersion = 2;         // 2: algo[16], compression[16], compression_key
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr size_t kSqEntryBytes = 128;
inline constexpr size_t kCqEntryBytes = 512;
inline constexpr size_t kCqMessageOffset = 32;
inline constexpr size_t kCqMessageBytes = kCqEntryBytes - kCqMessageOffset;
inline constexpr size_t kAlgoBytes = 16;
inline constexpr size_t kCompressionBytes = 16;
inline constexpr uint32_t kMinEntries = 8;
inline constexpr uint32_t kMaxEntries = 65536;
inline constexpr uint32_t kDefaultSqEntries = 1024;
inline constexpr uint32_t kDefaultCqEntries = 1024;

// Header field offsets (each written by one side; hot ones on their own cache line).
inline constexpr size_t kOffMagic = 0;             // u32
inline constexpr size_t kOffVersion = 4;           // u32
inline constexpr size_t kOffSqEntries = 8;         // u32
inline constexpr size_t kOffCqEntries = 12;        // u32
inline constexpr size_t kOffSqTail = 64;           // u64, client
inline constexpr size_t kOffSqHead = 128;          // u64, daemon
inline constexpr size_t kOffSqDoorbell = 192;      // u32 futex, client adds
inline constexpr size_t kOffDaemonSleeping = 196;  // u32, daemon
inline constexpr size_t kOffCqTail = 256;          // u64, daemon
inline constexpr size_t kOffCqHead = 320;          // u64, client
inline constexpr size_t kOffCqDoorbell = 384;      // u32 futex, daemon adds
inline constexpr size_t kOffClientWaiters = 388;   // u32, client

// Submission entry field offsets.
inline constexpr size_t kSqRequestId = 0;
inline constexpr size_t kSqCommHandle = 8;
inline constexpr size_t kSqCount = 16;
inline constexpr size_t kSqSendBuffer = 24;
inline constexpr size_t kSqSendOffset = 32;
inline constexpr size_t kSqRecvBuffer = 40;
inline constexpr size_t kSqRecvOffset = 48;
inline constexpr size_t kSqOp = 56;
inline constexpr size_t kSqDtype = 60;
inline constexpr size_t kSqRedOp = 64;
inline constexpr size_t kSqRoot = 68;
inline constexpr size_t kSqTimeoutMs = 72;
inline constexpr size_t kSqFlags = 76;
inline constexpr size_t kSqExtSlots = 80;
inline constexpr size_t kSqVecLen = 84;
inline constexpr size_t kSqAlgo = 88;
inline constexpr size_t kSqCompression = 104;
inline constexpr size_t kSqCompressionKey = 120;

// flags: the next entry belongs to the same group (ncclGroupStart/End); the group ends at the
// first entry without it.
inline constexpr uint32_t kFlagGroupNext = 1;
// SubmitRequest.error_feedback: compression_key names the residual.
inline constexpr uint32_t kFlagErrorFeedback = 2;
// SubmitRequest.stream_sync: the last extension slot holds it.
inline constexpr uint32_t kFlagStreamSync = 4;
inline constexpr uint32_t kKnownFlags = kFlagGroupNext | kFlagErrorFeedback | kFlagStreamSync;
inline constexpr size_t kSyncBuffer = 0;  // offsets in the stream-sync slot
inline constexpr size_t kSyncOffset = 8;
inline constexpr size_t kSyncValue = 16;

// Completion entry field offsets.
inline constexpr size_t kCqRequestId = 0;
inline constexpr size_t kCqSeq = 8;
inline constexpr size_t kCqCode = 16;
inline constexpr size_t kCqMessageLen = 20;
inline constexpr size_t kCqFlags = 24;
// Completion flags: the request is handed back untaken (local.proto COMPLETION_MOVED); its code
// is UNAVAILABLE for a client that does not know the bit. Once reserved (zero): version 2 still.
inline constexpr uint32_t kCqFlagMoved = 1;

inline constexpr uint64_t SqOffset() { return kHeaderBytes; }
inline constexpr uint64_t CqOffset(uint32_t sq_entries) {
  return kHeaderBytes + static_cast<uint64_t>(sq_entries) * kSqEntryBytes;
}
// Bytes of the memfd for these geometries.
inline constexpr uint64_t RingBytes(uint32_t sq_entries, uint32_t cq_entries) {
  return CqOffset(sq_entries) + static_cast<uint64_t>(cq_entries) * kCqEntryBytes;
}
// Extension slots an AllToAllv entry needs for vectors of vec_len entries.
inline constexpr uint64_t ExtSlotsFor(uint64_t vec_len) {
  return (4 * 8 * vec_len + kSqEntryBytes - 1) / kSqEntryBytes;
}
inline constexpr bool ValidEntries(uint32_t n) {
  return n >= kMinEntries && n <= kMaxEntries && (n & (n - 1)) == 0;
}

}  // namespace railyard::ringproto
