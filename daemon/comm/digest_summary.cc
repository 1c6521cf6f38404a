#include "daemon/comm/digest_summary.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace railyard {

namespace {

constexpr size_t kOffKind = 0, kOffA = 4, kOffB = 8, kOffPad = 12, kOffDa = 16,
                 kOffDb = kOffDa + OpDigest::kBytes;
constexpr uint32_t kNone = 0xffffffffu;

template <typename T>
void Put(DigestSummary::Wire& w, size_t off, T v) {
  std::memcpy(w.data() + off, &v, sizeof v);
}
template <typename T>
T Get(const std::byte* data, size_t off) {
  T v;
  std::memcpy(&v, data + off, sizeof v);
  return v;
}

// A summary that `by` found something wrong with what `of` sent (or did not): why, cut to
// kMaxReason bytes and made printable.
DigestSummary Problem(DigestSummary::Kind kind, int by, int of, const std::string& why) {
  DigestSummary s;
  s.kind = kind;
  s.a = by;
  s.b = of;
  s.reason = why.substr(0, DigestSummary::kMaxReason);
  for (char& c : s.reason) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return s;
}

int Rank(DigestSummary::Kind k) {
  switch (k) {
    case DigestSummary::Kind::kDisagree:
    case DigestSummary::Kind::kUnreadable:
      return 2;
    case DigestSummary::Kind::kMissing:
      return 1;
    case DigestSummary::Kind::kAgree:
      break;
  }
  return 0;
}

}  // namespace

DigestSummary DigestSummary::Of(int node, const OpDigest& digest) {
  DigestSummary s;
  s.kind = Kind::kAgree;
  s.a = node;
  s.da = digest;
  return s;
}

DigestSummary DigestSummary::Unreadable(int by, int of, const std::string& why) {
  return Problem(Kind::kUnreadable, by, of, why);
}

DigestSummary DigestSummary::Missing(int by, int of, const absl::Status& why) {
  return Problem(Kind::kMissing, by, of, why.ToString());
}

size_t DigestSummary::Encode(Wire* out) const {
  Wire& w = *out;
  w.fill(std::byte{0});
  Put<uint8_t>(w, kOffKind, static_cast<uint8_t>(kind));
  Put<uint32_t>(w, kOffA, static_cast<uint32_t>(a));
  Put<uint32_t>(w, kOffB, kind == Kind::kAgree ? kNone : static_cast<uint32_t>(b));
  const bool has_da = kind == Kind::kAgree || kind == Kind::kDisagree;
  if (has_da) {
    const OpDigest::Wire d = da.Encode();
    std::memcpy(w.data() + kOffDa, d.data(), d.size());
  }
  if (kind == Kind::kAgree) return kAgreeBytes;
  if (kind == Kind::kDisagree) {
    const OpDigest::Wire d = db.Encode();
    std::memcpy(w.data() + kOffDb, d.data(), d.size());
  } else {
    std::memcpy(w.data() + kOffDb, reason.data(), std::min(reason.size(), kMaxReason));
  }
  return kMaxBytes;
}

absl::StatusOr<std::pair<DigestSummary, size_t>> DigestSummary::Decode(const std::byte* data,
                                                                       size_t length, int nodes) {
  // Each message is what the sender "sent": the object of Verdict's sentence.
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("an operation digest with ", what));
  };
  auto too_short = [&](size_t size) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", length, "-byte operation digest, not ", size));
  };
  if (length < kAgreeBytes) return too_short(kAgreeBytes);
  DigestSummary s;
  const uint8_t kind = Get<uint8_t>(data, kOffKind);
  if (kind < static_cast<uint8_t>(Kind::kAgree) || kind > static_cast<uint8_t>(Kind::kMissing)) {
    return bad(absl::StrCat("kind ", kind, ", unknown"));
  }
  s.kind = static_cast<Kind>(kind);
  const size_t size = s.kind == Kind::kAgree ? kAgreeBytes : kMaxBytes;
  if (length < size) return too_short(size);
  for (size_t off :
       {size_t{1}, size_t{2}, size_t{3}, kOffPad, kOffPad + 1, kOffPad + 2, kOffPad + 3}) {
    if (Get<uint8_t>(data, off) != 0) return bad("nonzero padding");
  }
  const uint32_t a = Get<uint32_t>(data, kOffA);
  const uint32_t b = Get<uint32_t>(data, kOffB);
  const auto out_of_range = [&](uint32_t n) {
    return bad(absl::StrCat("node ", n, " of ", nodes));
  };
  if (a >= static_cast<uint32_t>(nodes)) return out_of_range(a);
  s.a = static_cast<int32_t>(a);
  if (s.kind == Kind::kAgree) {
    if (b != kNone) return bad("a second node in an agreement");
  } else {
    if (b >= static_cast<uint32_t>(nodes)) return out_of_range(b);
    if (a == b) return bad(absl::StrCat("node ", a, " against itself"));
    s.b = static_cast<int32_t>(b);
  }
  const auto digest = [&](size_t off) -> absl::StatusOr<OpDigest> {
    OpDigest::Wire w;
    std::memcpy(w.data(), data + off, w.size());
    absl::StatusOr<OpDigest> d = OpDigest::Decode(w);
    if (d.ok()) return d;
    // "operation digest from a peer: bad magic" -> "an operation digest with bad magic"
    const absl::string_view why = d.status().message();
    const size_t colon = why.find(": ");
    return bad(colon == absl::string_view::npos ? why : why.substr(colon + 2));
  };
  if (s.kind == Kind::kAgree || s.kind == Kind::kDisagree) {
    absl::StatusOr<OpDigest> da = digest(kOffDa);
    if (!da.ok()) return da.status();
    s.da = *std::move(da);
  } else {
    for (size_t i = 0; i < OpDigest::kBytes; ++i) {
      if (Get<uint8_t>(data, kOffDa + i) != 0) return bad("nonzero padding");
    }
  }
  if (s.kind == Kind::kDisagree) {
    absl::StatusOr<OpDigest> db = digest(kOffDb);
    if (!db.ok()) return db.status();
    s.db = *std::move(db);
    if (s.da.Differs(s.db).empty()) return bad("a disagreement of equal digests");
  } else if (s.kind != Kind::kAgree) {
    size_t n = 0;
    while (n < kMaxReason && Get<uint8_t>(data, kOffDb + n) != 0) ++n;
    for (size_t i = 0; i < kMaxReason; ++i) {
      const uint8_t c = Get<uint8_t>(data, kOffDb + i);
      if (i < n ? (c < 0x20 || c > 0x7e) : c != 0) return bad("an unprintable reason");
    }
    s.reason.assign(reinterpret_cast<const char*>(data + kOffDb), n);
  }
  return std::make_pair(std::move(s), size);
}

DigestSummary DigestSummary::Merge(const DigestSummary& lower, const DigestSummary& upper) {
  const int lo = Rank(lower.kind), hi = Rank(upper.kind);
  if (lo > 0 || hi > 0) return lo >= hi ? lower : upper;
  if (lower.da.Differs(upper.da).empty()) return lower;
  DigestSummary s;
  s.kind = Kind::kDisagree;
  s.a = lower.a;
  s.da = lower.da;
  s.b = upper.a;
  s.db = upper.da;
  return s;
}

absl::Status DigestSummary::Verdict(uint64_t seq, int me,
                                    const std::function<std::string(int)>& node_name,
                                    const std::function<std::vector<int>(int)>& ranks_of) const {
  switch (kind) {
    case Kind::kAgree:
      return absl::OkStatus();
    case Kind::kDisagree: {
      // Worded from a's side as DisagreementError words it from this node's: the other first.
      const bool b_is_me = b == me;
      const int mine = b_is_me ? b : a, theirs = b_is_me ? a : b;
      return DisagreementError(seq, node_name(mine), ranks_of(mine), b_is_me ? db : da,
                               node_name(theirs), ranks_of(theirs), b_is_me ? da : db);
    }
    case Kind::kUnreadable:
      return absl::InvalidArgumentError(absl::StrCat("seq ", seq, ": ", node_name(b), " sent ",
                                                     a == me ? "" : node_name(a) + " ", reason));
    case Kind::kMissing:
      if (a == me) return absl::OkStatus();
      return absl::UnavailableError(absl::StrCat("seq ", seq, ": ", node_name(a),
                                                 " did not receive ", node_name(b),
                                                 "'s operation digest: ", reason));
  }
  return absl::InternalError("digest summary of no kind");
}

}  // namespace railyard
