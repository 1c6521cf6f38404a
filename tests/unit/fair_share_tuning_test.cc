// FairShare and Tuning, DaemonCore's fair-share and cost-model parts, on their own (no daemon,
// no transport): which rails get a fair queue and the chunk size the slowest pace gives; job
// weights from a file, from an operator, and a bad file keeping what was in use; a calibration
// refused, stored, handed out and read back at the next start; explain's refusals.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/core/cost_model_proto.h"
#include "daemon/core/fair_share.h"
#include "daemon/core/tuning.h"
#include "daemon/scheduler/cost/calibration.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/ry-unit-XXXXXX";
    path_ = ::mkdtemp(tmpl) != nullptr ? tmpl : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

v1::NodeTopology Rails(const std::vector<std::string>& paces) {
  v1::NodeTopology t;
  for (size_t r = 0; r < paces.size(); ++r) {
    v1::Rail* rail = t.add_rails();
    rail->set_name("nic" + std::to_string(r));
    rail->set_pace(paces[r]);
  }
  return t;
}

TEST(FairShareTest, PacedRailsGetAQueueAndTheSlowestPaceSetsTheChunk) {
  FairShare share("", {});
  share.StartRails(Rails({"1Gbit/s", "", "10Gbit/s"}));
  ASSERT_EQ(share.rail_names(), (std::vector<std::string>{"nic0", "nic1", "nic2"}));
  ASSERT_EQ(share.rail_queues().size(), 3u);
  EXPECT_NE(share.rail_queues()[0], nullptr);
  EXPECT_EQ(share.rail_queues()[1], nullptr) << "a rail without a pace is not queued";
  EXPECT_NE(share.rail_queues()[2], nullptr);
  // 2.5 ms at 125 MB/s is 312,500 bytes: the power of two at or below it.
  EXPECT_EQ(share.PacedChunkBytes(), 262144u);
  v1::ListJobsResponse jobs = share.ListJobs();
  ASSERT_EQ(jobs.rails_size(), 3);
  EXPECT_DOUBLE_EQ(jobs.rails(0).pace_bytes_per_second(), 125e6);
  EXPECT_EQ(jobs.rails(1).pace_bytes_per_second(), 0);
  share.Shutdown();
  share.Shutdown();  // idempotent

  FairShare unpaced("", {});
  unpaced.StartRails(Rails({"", ""}));
  EXPECT_EQ(unpaced.PacedChunkBytes(), 0u);
}

TEST(FairShareTest, WeightsComeFromTheFileAndOperatorsAndABadFileKeepsThem) {
  TempDir dir;
  const std::string file = dir.path() + "/weights";
  std::ofstream(file) << "# jobs\ntrain 3\neval 0.5\n";
  FairShare share(file, {});
  ASSERT_TRUE(share.LoadWeights().ok());
  EXPECT_EQ(share.Weight("train"), 3);
  EXPECT_EQ(share.Weight("eval"), 0.5);
  EXPECT_EQ(share.Weight("other"), 1) << "a job not named weighs 1";

  absl::StatusOr<double> previous = share.SetWeight("eval", 2);
  ASSERT_TRUE(previous.ok()) << previous.status();
  EXPECT_EQ(*previous, 0.5);
  EXPECT_EQ(share.Weight("eval"), 2);
  EXPECT_EQ(share.SetWeight("eval", -1).status().code(), absl::StatusCode::kInvalidArgument);

  std::ofstream(file) << "train three\n";
  share.ReloadWeights();  // logged, not applied
  EXPECT_EQ(share.Weight("train"), 3);
  v1::ListJobsResponse jobs = share.ListJobs();
  EXPECT_EQ(jobs.weights_file(), file);
  bool saw_eval = false;
  for (const v1::JobShare& j : jobs.jobs()) {
    if (j.job_id() == "eval") {
      saw_eval = true;
      EXPECT_EQ(j.weight(), 2);
      EXPECT_EQ(j.weight_source(), "admin");
    }
  }
  EXPECT_TRUE(saw_eval);

  FairShare missing(dir.path() + "/none", {});
  EXPECT_FALSE(missing.LoadWeights().ok()) << "an unreadable --job_weights stops the start";
}

TEST(TuningTest, ACalibrationIsRefusedOrStoredHandedOutAndReadBackAtTheNextStart) {
  TempDir dir;
  std::vector<v1::CostModel> handed;
  Tuning tuning(dir.path(), nullptr, [&](const v1::CostModel& m) { handed.push_back(m); });
  tuning.LoadAtStart();
  ASSERT_EQ(handed.size(), 1u);
  EXPECT_EQ(handed[0].source(), "default") << "no calibration stored: the built-in one";

  v1::CostModel bad = ToProto(scheduler::cost::Calibration::Defaults());
  bad.set_inter_beta_bytes_per_s(-5);
  EXPECT_EQ(tuning.SetCalibration(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(handed.size(), 1u);

  scheduler::cost::Calibration fit = scheduler::cost::Calibration::Defaults();
  fit.inter.beta_bytes_per_s = 2.5e9;
  fit.source = "fit";
  absl::StatusOr<std::string> path = tuning.SetCalibration(ToProto(fit));
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir.path() + "/calibration.json");
  EXPECT_TRUE(std::filesystem::exists(*path));
  ASSERT_EQ(handed.size(), 2u);
  EXPECT_EQ(handed[1].inter_beta_bytes_per_s(), 2.5e9);
  EXPECT_EQ(tuning.CostModel().source(), "fit");

  Tuning restarted(dir.path(), nullptr, nullptr);
  restarted.LoadAtStart();
  EXPECT_EQ(restarted.CostModel().inter_beta_bytes_per_s(), 2.5e9);
}

TEST(TuningTest, ExplainRefusesWhatItCannotWeigh) {
  CommRegistry comms;
  Tuning tuning("/nonexistent", &comms, nullptr);
  v1::ExplainRequest req;
  req.set_op("sendrecv");
  EXPECT_EQ(tuning.Explain(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_op("allreduce");
  req.set_dtype("float128");
  EXPECT_THAT(tuning.Explain(req).status().message(), HasSubstr("float128"));
  req.set_dtype("");
  absl::StatusOr<v1::ExplainResponse> none = tuning.Explain(req);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("no multi-node communicator"));
}

}  // namespace
}  // namespace railyard
