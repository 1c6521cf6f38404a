// The buffer side channel: the one thing the Local gRPC API cannot carry is a file descriptor, so
// a client passes its buffers' memfds to railyardd over a second Unix socket beside the client
// socket, "<socket>.fd" (SOCK_SEQPACKET: one message per packet; docs/local-api.md, "Buffers").
//
//   client                                   railyardd
//   connect(<socket>.fd)            ---->    accept; SO_PEERCRED: who is this
//                                   <----    HELLO  payload = ticket (32 hex digits)
//   Local.Connect(job, token, fd_ticket = ticket)    binds this connection to the new session
//   PUT cookie + SCM_RIGHTS(memfd)  ---->    keeps the descriptor, unchecked, under a handle
//                                   <----    PUT_OK cookie, handle    (or ERROR cookie, code, text)
//   Local.RegisterBuffer(session, fd_handle = handle, size)   checks seals and size, maps it
//
// A handle names one descriptor of one connection, once. Every message is a 32-byte header,
// little-endian, then `length` payload bytes (at most kMaxPayload). Header-only: shared by the
// daemon and the C++ client; the Python client (railyard/_fd_channel.py) speaks the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace railyard::fdproto {

inline constexpr uint32_t kMagic = 0x44465952;  // "RYFD" read as little-endian bytes
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 32;
inline constexpr size_t kMaxPayload = 224;
inline constexpr size_t kMaxMessage = kHeaderBytes + kMaxPayload;
inline constexpr size_t kTicketChars = 32;

enum class Type : uint16_t {
  kHello = 1,  // daemon -> client: payload is the ticket Local.Connect names
  kPut = 2,    // client -> daemon: exactly one descriptor attached; cookie chosen by the client
  kPutOk = 3,  // daemon -> client: cookie echoed, handle for RegisterBuffer
  kError = 4,  // daemon -> client: cookie echoed (0 when not about a PUT), code, payload = text
};

struct Message {
  Type type = Type::kError;
  uint64_t cookie = 0;
  uint64_t handle = 0;
  uint32_t code = 0;    // google.rpc.Code (kError)
  std::string payload;  // ticket (kHello) or message (kError)
};

namespace detail {
inline void Put16(unsigned char* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void Put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void Put64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline uint64_t Get(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace detail

// The bytes of m (payload cut at kMaxPayload).
inline std::string Encode(const Message& m) {
  const size_t n = m.payload.size() < kMaxPayload ? m.payload.size() : kMaxPayload;
  std::string out(kHeaderBytes + n, '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  detail::Put32(p, kMagic);
  detail::Put16(p + 4, kVersion);
  detail::Put16(p + 6, static_cast<uint16_t>(m.type));
  detail::Put64(p + 8, m.cookie);
  detail::Put64(p + 16, m.handle);
  detail::Put32(p + 24, m.code);
  detail::Put32(p + 28, static_cast<uint32_t>(n));
  if (n > 0) std::memcpy(p + kHeaderBytes, m.payload.data(), n);
  return out;
}

// The message in bytes, or nullopt with *why saying what is wrong (short, bad magic, version,
// type, length disagreeing with the packet).
inline std::optional<Message> Decode(std::string_view bytes, std::string* why) {
  auto fail = [why](const char* w) -> std::optional<Message> {
    if (why != nullptr) *why = w;
    return std::nullopt;
  };
  if (bytes.size() < kHeaderBytes) return fail("message shorter than its 32-byte header");
  if (bytes.size() > kMaxMessage) return fail("message longer than 256 bytes");
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (detail::Get(p, 4) != kMagic) return fail("bad magic (not a Railyard fd channel message)");
  if (detail::Get(p + 4, 2) != kVersion) return fail("unsupported fd channel version");
  const uint64_t type = detail::Get(p + 6, 2);
  if (type < 1 || type > 4) return fail("unknown message type");
  const uint64_t length = detail::Get(p + 28, 4);
  if (length != bytes.size() - kHeaderBytes)
    return fail("payload length disagrees with the packet");
  Message m;
  m.type = static_cast<Type>(type);
  m.cookie = detail::Get(p + 8, 8);
  m.handle = detail::Get(p + 16, 8);
  m.code = static_cast<uint32_t>(detail::Get(p + 24, 4));
  m.payload.assign(bytes.data() + kHeaderBytes, length);
  return m;
}

// "<socket>.fd": where the side channel of the client socket at `socket` listens.
inline std::string SocketPath(std::string_view client_socket) {
  return std::string(client_socket) + ".fd";
}

}  // namespace railyard::fdproto
