// Fuzz target: a digest summary as a daemon receives it from a peer daemon during the digest
// exchange (daemon/comm/digest_summary.h), the bytes of one message: the summary, then whatever
// payload it carries. Input: a node count byte (1..255), then the message. Properties of an
// accepted summary: it took kAgreeBytes or kMaxBytes of the message, no more than there were; its
// nodes are in range, two different ones unless it is an agreement; a disagreement's digests
// differ; its reason is printable; encoding it and decoding again gives the same summary, and
// merging it with an agreement either way and wording its verdict on any node stays bounded. A
// rejected one is INVALID_ARGUMENT with a bounded message.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/comm/digest_summary.h"
#include "tests/fuzz/fuzz_check.h"

namespace railyard {
namespace {

// How y differs from x ("" when it does not).
std::string Differs(const DigestSummary& x, const DigestSummary& y) {
  if (x.kind != y.kind || x.a != y.a || x.b != y.b || x.reason != y.reason) return "header";
  const bool has_da =
      x.kind == DigestSummary::Kind::kAgree || x.kind == DigestSummary::Kind::kDisagree;
  if (has_da && !x.da.Differs(y.da).empty()) return "da " + x.da.Differs(y.da);
  if (x.kind == DigestSummary::Kind::kDisagree && !x.db.Differs(y.db).empty()) {
    return "db " + x.db.Differs(y.db);
  }
  return "";
}

}  // namespace
}  // namespace railyard

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using railyard::DigestSummary;
  if (size < 1) return 0;
  const int nodes = data[0] == 0 ? 1 : data[0];
  const auto* msg = reinterpret_cast<const std::byte*>(data + 1);
  const size_t length = size - 1;
  auto got = DigestSummary::Decode(msg, length, nodes);
  if (!got.ok()) {
    const std::string problem =
        railyard::fuzz::ErrorProblem(got.status(), absl::StatusCode::kInvalidArgument, 160);
    FUZZ_CHECK(problem.empty(), problem);
    return 0;
  }
  const DigestSummary& s = got->first;
  const size_t took = got->second;
  FUZZ_CHECK(took <= length, absl::StrCat(took, " of ", length));
  FUZZ_CHECK(took == (s.kind == DigestSummary::Kind::kAgree ? DigestSummary::kAgreeBytes
                                                            : DigestSummary::kMaxBytes),
             absl::StrCat("took ", took));
  FUZZ_CHECK(s.a >= 0 && s.a < nodes, absl::StrCat("a ", s.a, " of ", nodes));
  if (s.kind == DigestSummary::Kind::kAgree) {
    FUZZ_CHECK(s.b == -1, absl::StrCat("b ", s.b, " in an agreement"));
  } else {
    FUZZ_CHECK(s.b >= 0 && s.b < nodes && s.b != s.a, absl::StrCat("b ", s.b, ", a ", s.a));
  }
  if (s.kind == DigestSummary::Kind::kDisagree) {
    FUZZ_CHECK(!s.da.Differs(s.db).empty(), "a disagreement of equal digests");
  }
  FUZZ_CHECK(s.reason.size() <= DigestSummary::kMaxReason, s.reason);
  for (char c : s.reason) FUZZ_CHECK(c >= 0x20 && c <= 0x7e, "unprintable reason");
  DigestSummary::Wire w;
  const size_t len = s.Encode(&w);
  FUZZ_CHECK(len == took, absl::StrCat(len, " vs ", took));
  auto again = DigestSummary::Decode(w.data(), len, nodes);
  FUZZ_CHECK(again.ok(), again.status().ToString());
  const std::string differs = railyard::Differs(s, again->first);
  FUZZ_CHECK(differs.empty(), "a different summary after a round trip: " + differs);
  const DigestSummary mine =
      DigestSummary::Of(0, s.kind == DigestSummary::Kind::kAgree ? s.da : railyard::OpDigest());
  const auto name = [](int n) { return absl::StrCat("node", n); };
  const auto ranks = [](int n) { return std::vector<int>{n}; };
  for (const DigestSummary& m : {s, DigestSummary::Merge(mine, s), DigestSummary::Merge(s, mine)}) {
    for (int me : {0, s.a, nodes - 1}) {
      const absl::Status v = m.Verdict(7, me, name, ranks);
      FUZZ_CHECK(v.message().size() <= 1024, std::string(v.message().substr(0, 200)));
      FUZZ_CHECK(v.ok() == (m.kind == DigestSummary::Kind::kAgree ||
                            (m.kind == DigestSummary::Kind::kMissing && m.a == me)),
                 v.ToString());
    }
  }
  return 0;
}
