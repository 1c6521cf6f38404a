// The metrics registry and its Prometheus text rendering: values, label escaping, histogram
// buckets, ordering, and counts that stay exact under concurrent updates.
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/metrics/daemon_metrics.h"
#include "daemon/metrics/exposition.h"
#include "daemon/metrics/registry.h"
#include "gtest/gtest.h"

namespace railyard::metrics {
namespace {

TEST(MetricsRegistry, CounterAndGaugeRender) {
  Registry r;
  auto& c = r.AddCounter("t_requests_total", "Requests.");
  c.Add({{"code", "200"}}).Increment(3);
  c.Add({{"code", "200"}}).Increment();
  c.Add({{"code", "500"}}).Increment(-5);  // ignored: counters never go down
  auto& g = r.AddGauge("t_temperature", "A gauge");
  g.Add({}).Set(-1.5);
  EXPECT_EQ(RenderText(r),
            "# HELP t_requests_total Requests.\n"
            "# TYPE t_requests_total counter\n"
            "t_requests_total{code=\"200\"} 4\n"
            "t_requests_total{code=\"500\"} 0\n"
            "# HELP t_temperature A gauge\n"
            "# TYPE t_temperature gauge\n"
            "t_temperature -1.5\n");
}

TEST(MetricsRegistry, EscapesLabelValuesAndHelp) {
  Registry r;
  r.AddGauge("t_g", "line1\nback\\slash").Add({{"a", "q\"uo\\te\nnl"}, {"b", ""}}).Set(1);
  EXPECT_EQ(RenderText(r),
            "# HELP t_g line1\\nback\\\\slash\n"
            "# TYPE t_g gauge\n"
            "t_g{a=\"q\\\"uo\\\\te\\nnl\",b=\"\"} 1\n");
}

TEST(MetricsRegistry, HistogramBucketsSumCount) {
  Registry r;
  auto& h = r.AddHistogram("t_latency_seconds", "Latency", {0.5, 0.1, 1});  // sorted on register
  Histogram& child = h.Add({{"op", "x"}});
  for (double v : {0.05, 0.1, 0.2, 0.7, 3.0}) child.Observe(v);
  EXPECT_EQ(RenderText(r),
            "# HELP t_latency_seconds Latency\n"
            "# TYPE t_latency_seconds histogram\n"
            "t_latency_seconds_bucket{op=\"x\",le=\"0.1\"} 2\n"
            "t_latency_seconds_bucket{op=\"x\",le=\"0.5\"} 3\n"
            "t_latency_seconds_bucket{op=\"x\",le=\"1\"} 4\n"
            "t_latency_seconds_bucket{op=\"x\",le=\"+Inf\"} 5\n"
            "t_latency_seconds_sum{op=\"x\"} 4.05\n"
            "t_latency_seconds_count{op=\"x\"} 5\n");
}

TEST(MetricsRegistry, FamiliesAndChildrenSorted) {
  Registry r;
  r.AddGauge("t_b", "b").Add({{"k", "z"}}).Set(1);
  r.AddGauge("t_b", "ignored").Add({{"k", "a"}}).Set(2);  // same family
  r.AddGauge("t_a", "a").Add({}).Set(3);
  EXPECT_EQ(RenderText(r),
            "# HELP t_a a\n# TYPE t_a gauge\nt_a 3\n"
            "# HELP t_b b\n# TYPE t_b gauge\nt_b{k=\"a\"} 2\nt_b{k=\"z\"} 1\n");
}

TEST(MetricsRegistry, FormatValue) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(1099511627776.0), "1099511627776");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1.0 / 3), "0.3333333333333333");  // shortest that round-trips
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
}

TEST(MetricsRegistry, ConcurrentIncrementsAreExact) {
  Registry r;
  Counter& c = r.AddCounter("t_total", "t").Add({});
  Histogram& h = r.AddHistogram("t_h", "t", {1}).Add({});
  constexpr int kThreads = 8, kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIters; ++i) {
        c.Increment(262144);
        h.Observe(i % 2 == 0 ? 0.5 : 2.0);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.Value(), 262144.0 * kThreads * kIters);
  const Histogram::Snapshot s = h.Collect();
  EXPECT_EQ(s.count, uint64_t{kThreads} * kIters);
  EXPECT_EQ(s.cumulative[0], uint64_t{kThreads} * kIters / 2);
}

TEST(MetricsRegistry, CollectHooksRunBeforeRender) {
  Registry r;
  Gauge& g = r.AddGauge("t_g", "t").Add({});
  int scrapes = 0;
  r.AddCollectHook([&] { g.Set(++scrapes); });
  EXPECT_NE(RenderText(r).find("t_g 1\n"), std::string::npos);
  EXPECT_NE(RenderText(r).find("t_g 2\n"), std::string::npos);
}

TEST(DaemonMetrics, SizeBucketsArePowersOfFourAndBounded) {
  EXPECT_EQ(SizeBucket(0), "0");
  EXPECT_EQ(SizeBucket(1), "1");
  EXPECT_EQ(SizeBucket(3), "1");
  EXPECT_EQ(SizeBucket(4), "4");
  EXPECT_EQ(SizeBucket(1 << 20), "1048576");
  EXPECT_EQ(SizeBucket((1 << 20) + 1), "1048576");
  EXPECT_EQ(SizeBucket((1 << 22) - 1), "1048576");
  EXPECT_EQ(SizeBucket(uint64_t{1} << 40), "4294967296");
}

TEST(DaemonMetrics, BusBandwidthFactors) {
  EXPECT_DOUBLE_EQ(BusBwFactor("allreduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(BusBwFactor("allgather", 4), 0.75);
  EXPECT_DOUBLE_EQ(BusBwFactor("broadcast", 4), 1);
  EXPECT_DOUBLE_EQ(BusBwFactor("barrier", 4), 0);
}

TEST(DaemonMetrics, CollectiveSeriesAndEwma) {
  DaemonMetrics m("n0", "1.2.3");
  CollectiveRecord rec{"allreduce", "ring", "jobA", 1 << 20, 4, absl::Milliseconds(1)};
  m.RecordCollective(rec);
  rec.elapsed = absl::Milliseconds(2);
  m.RecordCollective(rec);
  const std::string text = RenderText(m.registry());
  const std::string labels =
      "{algorithm=\"ring\",job=\"jobA\",op=\"allreduce\",size_bucket=\"1048576\"}";
  EXPECT_NE(text.find("railyard_collective_ops_total" + labels + " 2\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("railyard_collective_bytes_total" + labels + " 2097152\n"),
            std::string::npos);
  // last: 1 MiB / 2 ms; ewma: 0.2 * that + 0.8 * (1 MiB / 1 ms).
  EXPECT_NE(text.find("railyard_collective_algbw_bytes_per_second" + labels + " 524288000\n"),
            std::string::npos);
  EXPECT_NE(text.find("railyard_collective_busbw_bytes_per_second" + labels + " 786432000\n"),
            std::string::npos);
  EXPECT_NE(text.find("railyard_collective_algbw_ewma_bytes_per_second" + labels + " 943718400\n"),
            std::string::npos);
  EXPECT_NE(text.find("railyard_collective_latency_seconds_count" + labels + " 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("railyard_build_info{node=\"n0\",version=\"1.2.3\"} 1\n"), std::string::npos);
}

TEST(DaemonMetrics, LinksAndJobsFromSampler) {
  DaemonMetrics m("n0", "v");
  const LinkCounters* link = m.ForLink("n1", "rail1");
  EXPECT_EQ(link, m.ForLink("n1", "rail1"));
  link->tx_bytes->Increment(1000);
  link->rx_bytes->Increment(24);
  m.SetSampler([] {
    DaemonSample s;
    s.sessions = 3;
    s.registered_buffer_bytes = 4096;
    s.jobs["j"] = JobSample{2, 1, 1};
    return s;
  });
  const std::string text = RenderText(m.registry());
  EXPECT_NE(text.find("railyard_link_bytes_total{direction=\"tx\",node=\"n0\",peer=\"n1\","
                      "rail=\"rail1\"} 1000\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("railyard_link_bytes_total{direction=\"rx\",node=\"n0\",peer=\"n1\","
                      "rail=\"rail1\"} 24\n"),
            std::string::npos);
  EXPECT_NE(text.find("railyard_sessions 3\n"), std::string::npos);
  EXPECT_NE(text.find("railyard_registered_buffer_bytes 4096\n"), std::string::npos);
  EXPECT_NE(text.find("railyard_job_comms{job=\"j\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("railyard_job_fair_share_weight{job=\"j\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("railyard_peer_failures_total 0\n"), std::string::npos);
  m.AddJob("k");  // a job that connected between scrapes still shows
  EXPECT_NE(RenderText(m.registry()).find("railyard_job_comms{job=\"k\"} 0\n"), std::string::npos);
}

// The staging pool's state: gauges as sampled; counters that grow by what the pool's own
// counts grew between scrapes (never down, also if a sample comes back lower).
TEST(DaemonMetrics, StagingPoolFromSampler) {
  DaemonMetrics m("n0", "v");
  StagingSample staging{4 << 20, 8 << 20, 2, 0};
  m.SetSampler([&staging] {
    DaemonSample s;
    s.staging = staging;
    return s;
  });
  std::string text = RenderText(m.registry());
  EXPECT_NE(text.find("railyard_staging_host_bytes{state=\"leased\"} 4194304\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("railyard_staging_host_bytes{state=\"idle\"} 8388608\n"), std::string::npos);
  EXPECT_NE(text.find("railyard_staging_buffers_total{buffer=\"allocated\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("railyard_staging_buffers_total{buffer=\"reused\"} 0\n"), std::string::npos);
  staging = {0, 12 << 20, 3, 7};
  text = RenderText(m.registry());
  EXPECT_NE(text.find("railyard_staging_host_bytes{state=\"leased\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("railyard_staging_buffers_total{buffer=\"allocated\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("railyard_staging_buffers_total{buffer=\"reused\"} 7\n"), std::string::npos);
  staging = {0, 0, 1, 1};  // lower: the counters stay
  text = RenderText(m.registry());
  EXPECT_NE(text.find("railyard_staging_buffers_total{buffer=\"reused\"} 7\n"), std::string::npos);
  EXPECT_NE(text.find("railyard_staging_host_bytes{state=\"idle\"} 0\n"), std::string::npos);
}

// Every sample line of a rendering is unique and belongs to a family announced by # TYPE.
void ExpectValidExposition(const std::string& text) {
  std::set<std::string> families, series;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      families.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const std::string name = line.substr(0, line.find_first_of("{ "));
    bool announced = families.count(name) > 0;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx(suffix);
      if (name.size() > sfx.size() &&
          name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
        announced |= families.count(name.substr(0, name.size() - sfx.size())) > 0;
      }
    }
    EXPECT_TRUE(announced) << line;
    EXPECT_TRUE(series.insert(line.substr(0, line.rfind(' '))).second) << "duplicate: " << line;
  }
}

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

TEST(DaemonMetrics, JobsPastTheLimitAreSummedAsOtherAndGoneJobsLoseTheirSeries) {
  DaemonMetrics m("n0", "v", /*max_jobs=*/2, /*gone_grace=*/absl::ZeroDuration());
  std::map<std::string, JobSample> alive = {
      {"a", {1, 2, 0}}, {"b", {1, 0, 0}}, {"c", {2, 1, 1}}, {"d", {1, 3, 0}}};
  m.SetSampler([&alive] {
    DaemonSample s;
    s.jobs = alive;
    return s;
  });
  for (const char* job : {"a", "b", "c", "d"}) m.AddJob(job);  // in connect order
  EXPECT_EQ(m.JobLabel("a"), "a");
  EXPECT_EQ(m.JobLabel("c"), kOtherJob);
  for (const char* job : {"a", "c", "d"}) {
    m.RecordCollective({"allreduce", "local", job, 1024, 2, absl::Milliseconds(1)});
  }
  const std::string ops = "railyard_collective_ops_total{algorithm=\"local\",job=\"";
  const std::string tail = "\",op=\"allreduce\",size_bucket=\"1024\"} ";
  std::string text = RenderText(m.registry());
  ExpectValidExposition(text);
  EXPECT_TRUE(Has(text, "railyard_job_comms{job=\"a\"} 1\n")) << text;
  EXPECT_TRUE(Has(text, "railyard_job_comms{job=\"b\"} 1\n"));
  EXPECT_TRUE(Has(text, "railyard_job_comms{job=\"other\"} 3\n"));
  EXPECT_TRUE(Has(text, "railyard_job_queued_ops{job=\"other\"} 4\n"));
  EXPECT_TRUE(Has(text, "railyard_job_in_flight_ops{job=\"other\"} 1\n"));
  EXPECT_TRUE(Has(text, ops + "a" + tail + "1\n"));
  EXPECT_TRUE(Has(text, ops + "other" + tail + "2\n"));
  EXPECT_FALSE(Has(text, "job=\"c\""));
  EXPECT_FALSE(Has(text, "job=\"d\""));

  // a and c end. The next scrape still shows a (at 0), the one after has none of its series.
  alive.erase("a");
  alive.erase("c");
  text = RenderText(m.registry());
  EXPECT_TRUE(Has(text, "railyard_job_comms{job=\"a\"} 0\n")) << text;
  EXPECT_TRUE(Has(text, ops + "a" + tail + "1\n"));
  EXPECT_TRUE(Has(text, "railyard_job_comms{job=\"other\"} 1\n"));
  text = RenderText(m.registry());
  ExpectValidExposition(text);
  EXPECT_FALSE(Has(text, "job=\"a\"")) << text;
  EXPECT_TRUE(Has(text, "# TYPE railyard_collective_ops_total counter\n"));
  EXPECT_TRUE(Has(text, ops + "other" + tail + "2\n"));  // d is still alive

  // a's place goes to the next new job; a job named "other" is always summed as other.
  m.AddJob("e");
  m.AddJob("other");
  alive["e"] = {5, 0, 0};
  alive["other"] = {1, 0, 0};
  EXPECT_EQ(m.JobLabel("e"), "e");
  EXPECT_EQ(m.JobLabel("other"), kOtherJob);
  text = RenderText(m.registry());
  EXPECT_TRUE(Has(text, "railyard_job_comms{job=\"e\"} 5\n")) << text;
  EXPECT_TRUE(Has(text, "railyard_job_comms{job=\"other\"} 2\n"));

  // A job whose communicator still counts fabric bytes keeps its series until it lets go.
  std::shared_ptr<Counter> fabric = m.JobFabricBytes("b");
  fabric->Increment(4096);
  alive.erase("b");
  for (int i = 0; i < 3; ++i) text = RenderText(m.registry());
  EXPECT_TRUE(Has(text, "railyard_job_fabric_bytes_total{job=\"b\"} 4096\n")) << text;
  EXPECT_TRUE(Has(text, "railyard_job_comms{job=\"b\"} 0\n"));
  fabric.reset();
  text = RenderText(m.registry());
  EXPECT_FALSE(Has(text, "job=\"b\"")) << text;

  // When the last job summed as other ends, the other series go too.
  alive.erase("d");
  alive.erase("other");
  RenderText(m.registry());
  text = RenderText(m.registry());
  ExpectValidExposition(text);
  EXPECT_FALSE(Has(text, "job=\"other\"")) << text;
  EXPECT_TRUE(Has(text, "railyard_job_comms{job=\"e\"} 5\n"));
}

TEST(DaemonMetrics, AJobThatEndedKeepsItsSeriesForTheGracePeriod) {
  DaemonMetrics m("n0", "v", /*max_jobs=*/8, /*gone_grace=*/absl::Minutes(2));
  absl::Time now = absl::FromUnixSeconds(1000);
  m.SetClock([&now] { return now; });
  bool alive = true;
  m.SetSampler([&alive] {
    DaemonSample s;
    if (alive) s.jobs["short"] = JobSample{1, 0, 0};
    return s;
  });
  m.AddJob("short");
  m.RecordCollective({"barrier", "local", "short", 0, 2, absl::Milliseconds(1)});
  EXPECT_TRUE(Has(RenderText(m.registry()), "railyard_job_comms{job=\"short\"} 1\n"));
  alive = false;
  for (int i = 0; i < 4; ++i) {  // gone, scraped every 30 s: still there, at its final values
    now += absl::Seconds(30);
    const std::string text = RenderText(m.registry());
    EXPECT_TRUE(Has(text, "railyard_job_comms{job=\"short\"} 0\n")) << i << text;
    EXPECT_TRUE(Has(text,
                    "railyard_collective_ops_total{algorithm=\"local\",job=\"short\",op="
                    "\"barrier\",size_bucket=\"0\"} 1\n"))
        << i;
  }
  now += absl::Seconds(31);  // 2 min 1 s after the first scrape that saw it gone
  EXPECT_FALSE(Has(RenderText(m.registry()), "job=\"short\""));
}

TEST(DaemonMetrics, AHeldCounterOutlivesItsRemovedSeries) {
  Registry r;
  auto& f = r.AddCounter("t_total", "t");
  std::shared_ptr<Counter> held = f.Hold({{"job", "x"}});
  f.Add({{"job", "y"}}).Increment(2);
  EXPECT_TRUE(f.HeldElsewhere({{"job", "x"}}));
  EXPECT_FALSE(f.HeldElsewhere({{"job", "y"}}));
  EXPECT_EQ(f.RemoveWhere("job", "x"), 1u);
  held->Increment(5);  // still valid, no longer exported
  EXPECT_EQ(held->Value(), 5);
  EXPECT_EQ(RenderText(r), "# HELP t_total t\n# TYPE t_total counter\nt_total{job=\"y\"} 2\n");
  EXPECT_EQ(f.Add({{"job", "x"}}).Value(), 0);  // a new series starts at zero
}

}  // namespace
}  // namespace railyard::metrics
