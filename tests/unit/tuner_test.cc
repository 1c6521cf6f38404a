// The tuner (IR-based predictions through the fabric simulator) and the calibration fit.
#include "daemon/scheduler/cost/tuner.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/scheduler/cost/calibration.h"
#include "daemon/scheduler/sim/simulator.h"
#include "gtest/gtest.h"

namespace railyard::scheduler::cost {
namespace {

using topology::FabricKind;
using topology::FabricSpec;

OpShape Shape(OpKind op, uint64_t bytes) {
  OpShape s;
  s.op = op;
  s.count = bytes / 4;
  return s;
}

TunerOptions SmallOptions() {
  TunerOptions o;
  o.chunk_sizes = {0, 1 << 20};
  o.max_ir_transfers = 20000;
  return o;
}

// The choice is the cheapest executable candidate, by the prediction the tuner reports for it.
void ExpectArgmin(const Choice& c) {
  double best = 1e300;
  for (const Candidate& k : c.candidates) {
    if (!k.generator.empty()) best = std::min(best, k.time_s());
  }
  EXPECT_DOUBLE_EQ(c.predicted_s, best);
}

TEST(Tuner, BroadcastTreeWhenSmallRingWhenLarge) {
  // 16 flat nodes, alpha 10 us, 10 GB/s, 5 us CPU per message: a small broadcast is latency
  // bound (log2 N steps beat N-1), a large one bandwidth bound (the pipelined chain sends M
  // once per rank; a binary tree's interior ranks send it twice).
  const CommLayout layout = CommLayout::Uniform(16, 1, 1);
  const FabricSpec f = FabricForLayout(layout, {10e-6, 10e9}, {10e-6, 10e9}, 5e-6);
  absl::StatusOr<Choice> small = Tune(Shape(OpKind::kBroadcast, 8), layout, f, SmallOptions());
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->algorithm, kAlgoTree) << small->reason;
  EXPECT_TRUE(small->ir_based);
  ExpectArgmin(*small);
  absl::StatusOr<Choice> large =
      Tune(Shape(OpKind::kBroadcast, 16 << 20), layout, f, SmallOptions());
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(large->algorithm, kAlgoRing) << large->reason;
  EXPECT_EQ(large->chunk_bytes, 1u << 20);  // pipelined
  ExpectArgmin(*large);
}

TEST(Tuner, AllReduceLogLatencySmallHierarchicalLarge) {
  // 4 nodes x 2 ranks, intra-node links 4x faster than the inter-node ones.
  const CommLayout layout = CommLayout::Uniform(4, 2, 2);
  const FabricSpec f = FabricForLayout(layout, {5e-6, 4e9}, {60e-6, 1e9}, 5e-6);
  absl::StatusOr<Choice> small = Tune(Shape(OpKind::kAllReduce, 8), layout, f, SmallOptions());
  ASSERT_TRUE(small.ok()) << small.status();
  // Recursive doubling: log2(8) = 3 dependent steps, the fewest of any schedule.
  EXPECT_EQ(small->algorithm, kAlgoRd) << small->reason;
  ExpectArgmin(*small);
  absl::StatusOr<Choice> large =
      Tune(Shape(OpKind::kAllReduce, 64 << 20), layout, f, SmallOptions());
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(large->algorithm, kAlgoHier) << large->reason;
  ExpectArgmin(*large);
  // Every executable candidate was predicted on the IR, and hier beats the flat ring.
  double ring = 0, hier = 0;
  for (const Candidate& c : large->candidates) {
    if (c.generator.empty()) continue;
    EXPECT_TRUE(c.has_ir) << c.name << ": " << c.note;
    if (c.name == "ring") ring = c.ir_time_s;
    if (c.name == "hier") hier = c.ir_time_s;
  }
  EXPECT_GT(ring, 1.2 * hier);
}

// Each candidate's chunk is its best prediction's, or the largest chunk predicted within
// chunk_tie_tolerance of it; an unchunked schedule is taken only when it is the best itself.
// Checked against every chunk size tuned on its own, on the default calibration's fabric and on
// an RDMA-like one, where pipelining pays.
TEST(Tuner, ChunkTiesGoToTheLargestChunk) {
  const CommLayout two = CommLayout::Uniform(2, 1, 1);
  const CommLayout eight = CommLayout::Uniform(8, 1, 1);
  const Calibration d = Calibration::Defaults();
  struct Case {
    const CommLayout* layout;
    FabricSpec fabric;
  };
  const Case cases[] = {
      {&two, FabricForLayout(two, d.intra, d.inter, d.overhead_s)},
      {&eight, FabricForLayout(eight, d.intra, d.inter, d.overhead_s)},
      {&eight, FabricForLayout(eight, {0.5e-6, 450e9}, {3e-6, 50e9}, 1e-6)},
  };
  const std::vector<size_t> sizes = {0, 64 << 10, 256 << 10, 1 << 20};
  bool any_tie_moved = false;
  for (const Case& k : cases) {
    for (uint64_t bytes : {512ull << 10, 8ull << 20, 32ull << 20}) {
      SCOPED_TRACE(absl::StrCat(k.layout->nnodes, " nodes, ", bytes, " B, inter beta ",
                                k.fabric.inter.beta_bytes_per_s));
      const OpShape shape = Shape(OpKind::kAllReduce, bytes);
      // Every chunk size on its own: candidate name -> (chunk, time).
      std::map<std::string, std::vector<std::pair<size_t, double>>> alone;
      for (size_t chunk : sizes) {
        TunerOptions o;
        o.chunk_sizes = {chunk};
        absl::StatusOr<Choice> c = Tune(shape, *k.layout, k.fabric, o);
        ASSERT_TRUE(c.ok()) << c.status();
        for (const Candidate& cand : c->candidates) {
          if (cand.has_ir) alone[cand.name].push_back({cand.chunk_bytes, cand.ir_time_s});
        }
      }
      for (double tolerance : {0.0, 0.02, 0.10}) {
        TunerOptions o;
        o.chunk_sizes = sizes;
        o.chunk_tie_tolerance = tolerance;
        absl::StatusOr<Choice> c = Tune(shape, *k.layout, k.fabric, o);
        ASSERT_TRUE(c.ok()) << c.status();
        ExpectArgmin(*c);
        for (const Candidate& cand : c->candidates) {
          if (!cand.has_ir) continue;
          const auto& tried = alone[cand.name];
          ASSERT_FALSE(tried.empty()) << cand.name;
          std::pair<size_t, double> best = tried.front();
          for (const auto& t : tried) {
            if (t.second < best.second) best = t;
          }
          std::pair<size_t, double> want = best;
          for (const auto& t : tried) {
            if (t.first == 0 || want.first == 0 || t.second > best.second * (1 + tolerance)) {
              continue;
            }
            if (t.first > want.first) want = t;
          }
          EXPECT_EQ(cand.chunk_bytes, want.first) << cand.name << ", tolerance " << tolerance;
          EXPECT_DOUBLE_EQ(cand.ir_time_s, want.second) << cand.name;
          if (tolerance == 0) {
            EXPECT_DOUBLE_EQ(cand.ir_time_s, best.second) << cand.name;
          }
          if (want.first != best.first) any_tie_moved = true;
        }
      }
    }
  }
  // The rule did something on these fabrics (the default one's chunk sizes tie across daemons).
  EXPECT_TRUE(any_tie_moved);
}

// The CPU of the busiest rank the tuner prices, counted here from the schedule itself: per
// inter-node message at each end, and per byte reduced from another node or on the rank itself.
double BusiestCpu(const RankSchedule& s, const CommLayout& l, double message, double rate) {
  std::vector<double> cpu(l.nranks, 0);
  for (const Transfer& t : s.transfers) {
    const bool same_node = l.node_of_rank[t.src.rank] == l.node_of_rank[t.dst.rank];
    if (!same_node) {
      cpu[t.src.rank] += message;
      cpu[t.dst.rank] += message;
    }
    const bool own = t.src.rank == t.dst.rank;
    if (rate > 0 && t.kind == Transfer::Kind::kReduce && (!same_node || own)) {
      cpu[t.dst.rank] += t.bytes / rate;
    }
  }
  return *std::max_element(cpu.begin(), cpu.end());
}

// TunerOptions::message_cpu_s and reduce_bytes_per_s: every schedule's prediction is the
// simulator's time plus the busiest rank's CPU (inter-node messages only: steps inside a node
// are memory). Priced so, the messages a pipeline hides decide the chunk size (fewer, larger
// chunks once a message costs more CPU than pipelining saves), and on two nodes recursive
// doubling, which reduces the whole buffer on each rank, costs twice the tree's reduction.
TEST(Tuner, CpuTermsPriceTheBusiestRank) {
  const OpShape shape = Shape(OpKind::kAllReduce, 512 << 10);
  for (const CommLayout& layout :
       {CommLayout::Uniform(2, 1, 1), CommLayout::Uniform(2, 2, 1), CommLayout::Uniform(4, 1, 1)}) {
    const FabricSpec f = FabricForLayout(layout, {5e-6, 4e9}, {10e-6, 3e9}, 5e-6);
    struct Terms {
      double message, rate;
    };
    std::map<std::pair<double, double>, std::map<std::string, Candidate>> seen;
    const auto at = [&](double message, double rate, const std::string& name) {
      return seen[std::make_pair(message, rate)][name];
    };
    for (const Terms& terms :
         {Terms{0, 0}, Terms{2e-6, 0}, Terms{50e-6, 0}, Terms{0, 2e9}, Terms{5e-6, 4e9}}) {
      SCOPED_TRACE(absl::StrCat(layout.nnodes, " x ", layout.ranks_per_node(), ", ", terms.message,
                                " s, ", terms.rate, " B/s"));
      TunerOptions o;
      o.chunk_sizes = {64 << 10, 256 << 10};
      o.message_cpu_s = terms.message;
      o.reduce_bytes_per_s = terms.rate;
      absl::StatusOr<Choice> c = Tune(shape, layout, f, o);
      ASSERT_TRUE(c.ok()) << c.status();
      ExpectArgmin(*c);
      int checked = 0;
      for (const Candidate& k : c->candidates) {
        if (!k.has_ir || k.generator.empty()) continue;
        absl::StatusOr<RankSchedule> s = Generate(k.generator, shape, layout, k.chunk_bytes);
        ASSERT_TRUE(s.ok()) << k.name;
        const double want = BusiestCpu(*s, layout, terms.message, terms.rate);
        EXPECT_DOUBLE_EQ(k.cpu_s, want) << k.name;
        if (terms.message > 0 || terms.rate > 0) {
          EXPECT_GT(k.cpu_s, 0) << k.name;
        }
        absl::StatusOr<sim::JobResult> r = sim::SimulateSchedule(*s, layout, f);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_DOUBLE_EQ(k.ir_time_s, r->time_s + k.cpu_s) << k.name;
        seen[std::make_pair(terms.message, terms.rate)][k.name] = k;
        ++checked;
      }
      EXPECT_GE(checked, 3);
    }
    EXPECT_EQ(at(0, 0, "dbtree").chunk_bytes, size_t{64} << 10);
    EXPECT_EQ(at(50e-6, 0, "dbtree").chunk_bytes, size_t{256} << 10);
    if (layout.nnodes == 2 && layout.ranks_per_node() == 1) {
      // 512 KiB over 2 GB/s: rd reduces all of it on each rank, the tree half.
      EXPECT_DOUBLE_EQ(at(0, 2e9, "rd").cpu_s, (512 << 10) / 2e9);
      EXPECT_DOUBLE_EQ(at(0, 2e9, "dbtree").cpu_s, (256 << 10) / 2e9);
    }
  }
}

TEST(Tuner, SameInputsSameChoiceAndCached) {
  const CommLayout layout = CommLayout::FromNodeOfRank({0, 0, 0, 1, 1, 2}, 1);
  const FabricSpec f = FabricForLayout(layout, {5e-6, 4e9}, {60e-6, 1e9}, 5e-6);
  Tuner a(layout, f, SmallOptions()), b(layout, f, SmallOptions());
  for (uint64_t bytes : {4ull, 4096ull, 1ull << 20, 8ull << 20}) {
    auto x = a.Choose(Shape(OpKind::kAllReduce, bytes));
    auto y = b.Choose(Shape(OpKind::kAllReduce, bytes));
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ((*x)->algorithm, (*y)->algorithm);
    EXPECT_EQ((*x)->chunk_bytes, (*y)->chunk_bytes);
    EXPECT_EQ((*x)->predicted_s, (*y)->predicted_s);
    // Uneven nodes: hier cannot run, so it is never chosen.
    EXPECT_NE((*x)->algorithm, kAlgoHier);
    auto again = a.Choose(Shape(OpKind::kAllReduce, bytes));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->get(), x->get());  // the cached choice itself, not a re-tune
    EXPECT_EQ((*again)->predicted_s, (*x)->predicted_s);
  }
}

TEST(Tuner, OverBudgetFallsBackToClosedForms) {
  const CommLayout layout = CommLayout::Uniform(64, 8, 8);
  FabricSpec f = FabricForLayout(layout, {0.5e-6, 450e9}, {3e-6, 50e9}, 0);
  TunerOptions o = SmallOptions();
  o.max_ir_transfers = 100;
  absl::StatusOr<Choice> c = Tune(Shape(OpKind::kAllReduce, 1 << 30), layout, f, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->ir_based);
  for (const Candidate& k : c->candidates) {
    EXPECT_FALSE(k.has_ir);
    if (!k.generator.empty()) {
      EXPECT_NE(k.note.find("budget"), std::string::npos) << k.note;
    }
  }
}

TEST(Tuner, BadInput) {
  const CommLayout layout = CommLayout::Uniform(2, 1, 1);
  const FabricSpec f = FabricForLayout(layout, {1e-6, 1e9}, {1e-6, 1e9}, 0);
  EXPECT_FALSE(Tune(Shape(OpKind::kSend, 8), layout, f, SmallOptions()).ok());
  FabricSpec no_bw = f;
  no_bw.inter.beta_bytes_per_s = 0;
  EXPECT_FALSE(Tune(Shape(OpKind::kAllReduce, 8), layout, no_bw, SmallOptions()).ok());
}

TEST(Calibration, FitRecoversAlphaAndBeta) {
  // T = 40 us * L + B / 2 GB/s, exactly.
  std::vector<Sample> samples;
  for (double bytes : {1e3, 1e4, 1e5, 1e6, 1e7}) {
    const double l = 6, b = 1.75 * bytes;
    samples.push_back({l, b, 40e-6 * l + b / 2e9});
  }
  absl::StatusOr<LinearFit> fit = FitLinkClass(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->link.alpha_s, 40e-6, 1e-9);
  EXPECT_NEAR(fit->link.beta_bytes_per_s, 2e9, 1e3);
  EXPECT_LT(fit->rms_relative_error, 1e-9);
  // Noise of +-10 % keeps the fit within ~10 %.
  for (size_t i = 0; i < samples.size(); ++i) samples[i].measured_s *= (i % 2 ? 1.1 : 0.9);
  fit = FitLinkClass(samples);
  ASSERT_TRUE(fit.ok());
  EXPECT_NEAR(fit->link.alpha_s, 40e-6, 8e-6);
  EXPECT_NEAR(fit->link.beta_bytes_per_s, 2e9, 0.3e9);
}

TEST(Calibration, FitRejectsWhatCannotBeFitted) {
  EXPECT_FALSE(FitLinkClass({{1, 1, 1e-6}}).ok());
  EXPECT_FALSE(FitLinkClass({{1, 1, 1e-6}, {1, 2, -1}}).ok());
  // Time that does not grow with size gives no bandwidth.
  EXPECT_FALSE(FitLinkClass({{1, 1e3, 1e-3}, {1, 1e6, 1e-3}}).ok());
}

TEST(Calibration, FitWithOverheadRecoversAllThree) {
  // T = 25 us + 40 us * L + B / 2 GB/s, with L as a schedule in 256 KB chunks has it: the same
  // up to one chunk, then one more per chunk (were L affine in B, no sweep could tell the
  // constant from alpha).
  std::vector<Sample> samples;
  for (double bytes : {64e3, 256e3, 1e6, 4e6}) {
    const double l = 1 + std::ceil(bytes / 256e3), b = bytes;
    samples.push_back({l, b, 25e-6 + 40e-6 * l + b / 2e9});
  }
  absl::StatusOr<LinearFit> fit = FitLinkClassWithOverhead(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->overhead_s, 25e-6, 1e-9);
  EXPECT_NEAR(fit->link.alpha_s, 40e-6, 1e-9);
  EXPECT_NEAR(fit->link.beta_bytes_per_s, 2e9, 1e3);
  EXPECT_LT(fit->rms_relative_error, 1e-9);
  // Without the constant the same sweep fits worse: the constant goes into alpha and beta.
  absl::StatusOr<LinearFit> two = FitLinkClass(samples);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->overhead_s, 0);
  EXPECT_GT(two->rms_relative_error, 1e-3);
  // +-10 % noise keeps every figure within ~30 %.
  for (size_t i = 0; i < samples.size(); ++i) samples[i].measured_s *= (i % 2 ? 1.1 : 0.9);
  fit = FitLinkClassWithOverhead(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_GE(fit->overhead_s, 0);
  EXPECT_GE(fit->link.alpha_s, 0);
  EXPECT_NEAR(fit->link.beta_bytes_per_s, 2e9, 0.6e9);
  EXPECT_LT(fit->rms_relative_error, 0.15);
}

TEST(Calibration, FitWithOverheadKeepsEveryFigureNonNegative) {
  // Time that falls from 64 KiB to 256 KiB (one rank per daemon, a fresh connection's first
  // sweep) pulls an unconstrained constant or alpha below 0; the fit holds them at 0 instead and
  // still finds the bandwidth of the large sizes.
  std::vector<Sample> samples = {
      {2.25, 64e3, 300e-6}, {3, 256e3, 110e-6}, {6, 1e6, 360e-6}, {18, 4e6, 2.3e-3}};
  absl::StatusOr<LinearFit> fit = FitLinkClassWithOverhead(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_GE(fit->overhead_s, 0);
  EXPECT_GE(fit->link.alpha_s, 0);
  EXPECT_GT(fit->link.beta_bytes_per_s, 1e9);
  EXPECT_LT(fit->link.beta_bytes_per_s, 1e10);
}

TEST(Calibration, FitWithOverheadRejectsWhatCannotBeFitted) {
  // Two sizes cannot determine three figures.
  absl::StatusOr<LinearFit> fit = FitLinkClassWithOverhead({{2, 1e3, 1e-4}, {3, 1e6, 1e-3}});
  ASSERT_FALSE(fit.ok());
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fit.status().message().find("at least 3 sizes"), std::string::npos);
  // A constant time: all overhead, no bandwidth.
  fit = FitLinkClassWithOverhead({{2, 1e3, 1e-3}, {3, 1e5, 1e-3}, {6, 1e7, 1e-3}});
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.status().message().find("does not determine a bandwidth"), std::string::npos);
  // Not a measurement: zero, negative, NaN or infinite times and units.
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  for (const Sample& bad : std::vector<Sample>{{1, 1e6, 0},
                                               {1, 1e6, -1e-3},
                                               {1, 1e6, nan},
                                               {1, 1e6, inf},
                                               {nan, 1e6, 1e-3},
                                               {1, inf, 1e-3},
                                               {-1, 1e6, 1e-3}}) {
    fit = FitLinkClassWithOverhead({{2, 1e3, 1e-4}, {3, 1e5, 2e-4}, bad});
    ASSERT_FALSE(fit.ok());
    EXPECT_EQ(fit.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(Calibration, JsonAndFileRoundTrip) {
  Calibration c = Calibration::Defaults();
  c.source = "fit";
  c.inter = {33e-6, 1.5e9};
  c.op = "allreduce";
  c.algorithm = "ring";
  c.nranks = 4;
  c.nnodes = 2;
  absl::StatusOr<Calibration> back = FromJson(ToJson(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->inter.alpha_s, 33e-6);
  EXPECT_EQ(back->algorithm, "ring");
  char dir[] = "/tmp/railyard-calib-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  EXPECT_EQ(LoadCalibration(dir).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(SaveCalibration(dir, c).ok());
  absl::StatusOr<Calibration> loaded = LoadCalibration(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->inter.beta_bytes_per_s, 1.5e9);
  std::remove((std::string(dir) + "/calibration.json").c_str());
  rmdir(dir);
  Calibration bad = c;
  bad.inter.beta_bytes_per_s = -1;
  EXPECT_FALSE(Validate(bad).ok());
  EXPECT_FALSE(SaveCalibration("/tmp", bad).ok());
  EXPECT_FALSE(FromJson("{not json").ok());
  EXPECT_FALSE(FromJson(R"({"intra": {"alpha_s": 1}})").ok());
}

// The two figures railctl calibrate does not fit travel in the file; a file without them (written
// before they existed) gets the built-in ones, as a fit keeps them; bad values are refused.
TEST(Calibration, MessageCpuAndReduceRateRoundTrip) {
  Calibration c = Calibration::Defaults();
  EXPECT_GT(c.message_cpu_s, 0);
  EXPECT_GT(c.reduce_bytes_per_s, 0);
  c.message_cpu_s = 7e-6;
  c.reduce_bytes_per_s = 6e9;
  absl::StatusOr<Calibration> back = FromJson(ToJson(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->message_cpu_s, 7e-6);
  EXPECT_EQ(back->reduce_bytes_per_s, 6e9);
  const std::string old = R"({"intra": {"alpha_s": 5e-6, "beta_bytes_per_s": 4e9},)"
                          R"( "inter": {"alpha_s": 6e-5, "beta_bytes_per_s": 1e9}})";
  absl::StatusOr<Calibration> before = FromJson(old);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->message_cpu_s, Calibration::Defaults().message_cpu_s);
  EXPECT_EQ(before->reduce_bytes_per_s, Calibration::Defaults().reduce_bytes_per_s);
  const std::map<std::string, double Calibration::*> fields = {
      {"message_cpu_s", &Calibration::message_cpu_s},
      {"reduce_bytes_per_s", &Calibration::reduce_bytes_per_s}};
  for (const auto& [field, member] : fields) {
    for (double bad : {-1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
      Calibration b = c;
      b.*member = bad;
      const absl::Status s = Validate(b);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << " " << bad;
      EXPECT_NE(std::string(s.message()).find(absl::StrCat("calibration ", field, " = ")),
                std::string::npos)
          << s.message();
    }
    EXPECT_EQ(FromJson(absl::StrCat(old.substr(0, old.size() - 1), ", \"", field, "\": -2}"))
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << field;
  }
}

// Found by tests/fuzz/calibration_fuzz: an integer field out of int's range was undefined
// behaviour (UBSan: 1e+305 is outside the range of representable values of type 'int'). Seen
// beside it: a non-finite fit error was stored as null, so the daemon's own file no longer loaded.
TEST(Calibration, FileIntegersAndFitErrorAreChecked) {
  const std::string links = R"("intra": {"alpha_s": 5e-6, "beta_bytes_per_s": 4e9},)"
                            R"( "inter": {"alpha_s": 6e-5, "beta_bytes_per_s": 1e9})";
  for (const char* bad : {"1e305", "2147483648", "-2147483649", "4.5", "\"4\"", "true"}) {
    absl::StatusOr<Calibration> c = FromJson(absl::StrCat("{", links, R"(, "nnodes": )", bad, "}"));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    const std::string message(c.status().message());
    EXPECT_EQ(message.rfind("calibration: nnodes = ", 0), 0u) << message;
    EXPECT_NE(message.find("is not an integer in [-2^31, 2^31)"), std::string::npos) << message;
  }
  absl::StatusOr<Calibration> ok = FromJson(
      absl::StrCat("{", links, R"(, "nranks": 2147483647, "nnodes": -3, "samples": 12.0})"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->nranks, 2147483647);
  EXPECT_EQ(ok->nnodes, -3);
  EXPECT_EQ(ok->samples, 12);

  Calibration c = Calibration::Defaults();
  c.rms_relative_error = std::numeric_limits<double>::infinity();
  absl::Status s = Validate(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("calibration rms_relative_error = inf"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(FromJson(absl::StrCat("{", links, R"(, "rms_relative_error": 1e999})")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace railyard::scheduler::cost
