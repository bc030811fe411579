// The coordinator's HTTP renderings, checked on hand-made snapshots: the
// Prometheus exposition, the history CSV and the tensor statistics.

#include "server/metrics.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/model_stats.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(HistogramTest, CountsByUpperBoundInclusive) {
  Histogram h({1, 2, 5});
  for (double v : {0.5, 1.0, 1.5, 2.0, 4.0, 5.0, 7.0}) h.Observe(v);
  // le=1: 0.5, 1.0 | le=2: 1.5, 2.0 | le=5: 4, 5 | +Inf: 7
  EXPECT_THAT(h.counts(), ElementsAre(2, 2, 2, 1));
  EXPECT_EQ(h.count(), 7u);
  EXPECT_DOUBLE_EQ(h.sum(), 21.0);
}

v1::RoundRecord Round(int64_t round, const char* outcome, double loss,
                      bool evaluation = false) {
  v1::RoundRecord r;
  r.set_round(round);
  r.set_attempt(1);
  r.set_evaluation(evaluation);
  r.set_selected(3);
  r.set_responded(outcome == std::string("abandoned") ? 1 : 3);
  r.set_dropped(3 - r.responded());
  r.set_outcome(outcome);
  r.set_duration_seconds(1.5);
  r.set_bytes_received(1200);
  r.set_bytes_sent(3600);
  r.mutable_metrics()->set_train_loss(loss);
  r.mutable_metrics()->set_train_accuracy(0.75);
  r.mutable_metrics()->set_num_examples(300);
  return r;
}

// A run in round 3 of training: round 1 closed, round 2 abandoned then
// closed with validation, round 3 open.
v1::GetStatusResponse TrainingStatus() {
  v1::GetStatusResponse s;
  s.set_run_id("run\"1\\");
  s.set_phase(v1::PHASE_TRAINING);
  s.set_round(3);
  s.mutable_model()->set_name("mlp_2nn");
  s.mutable_model()->set_num_parameters(199210);
  *s.add_history() = Round(1, "all", 2.0);
  *s.add_history() = Round(2, "abandoned", 9.0);
  v1::RoundRecord validated = Round(2, "quorum", 1.0);
  validated.set_attempt(2);
  validated.set_relative_improvement(0.5);
  validated.mutable_metrics()->set_has_validation(true);
  validated.mutable_metrics()->set_validation_loss(1.25);
  validated.mutable_metrics()->set_validation_accuracy(0.8);
  *s.add_history() = validated;
  v1::RoundRecord open = Round(3, "open", 0);
  open.set_responded(1);
  *s.mutable_current_round() = open;
  // Counted over every client; the listed page (here none) does not matter.
  v1::ClientCounts* counts = s.mutable_client_counts();
  counts->set_joined(4);
  counts->set_ready(1);
  counts->set_training(2);
  counts->set_gone(1);
  s.set_bytes_received(3600);
  s.set_bytes_sent(10800);
  return s;
}

RunCounters TrainingCounters() {
  RunCounters c;
  c.rounds_completed = 2;
  c.rounds_abandoned = 1;
  c.evaluations_abandoned = 4;
  c.updates_accepted = 8;
  c.updates_rejected.set_duplicate(2);
  c.updates_rejected.set_stale_round(1);
  c.round_duration.Observe(0.5);
  c.round_duration.Observe(30);
  c.round_duration.Observe(1000);
  c.aggregation_latency.Observe(0.002);
  return c;
}

// Two slow downloads of one old version and one of the current version, one
// upload holding a receive buffer and two waiting for one.
TransferStats Transfers() {
  TransferStats t;
  t.downloads = 3;
  t.download_versions = 2;
  t.download_version_bytes = 2 * 796840;
  t.downloads_stalled = 5;
  t.downloads_moved_on = 7;
  t.receive_buffers = 4;
  t.receive_buffers_in_use = 1;
  t.uploads_waiting = 2;
  return t;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

TEST(PrometheusTest, ExpositionIsWellFormed) {
  const std::string text =
      RenderPrometheus(TrainingStatus(), TrainingCounters(), Transfers());
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const std::regex sample(
      R"(([a-z_]+)(\{[a-z_]+="([^"\\]|\\.)*"(,[a-z_]+="([^"\\]|\\.)*")*\})? )"
      R"((-?[0-9.e+-]+|\+Inf|-Inf|NaN))");
  const std::regex help(R"(# HELP (fedlearn_[a-z_]+) .+)");
  const std::regex type(
      R"(# TYPE (fedlearn_[a-z_]+) (counter|gauge|histogram))");
  std::set<std::string> families;
  std::string family, family_type;
  for (const std::string& line : Lines(text)) {
    std::smatch m;
    if (std::regex_match(line, m, help)) {
      family = m[1];
      EXPECT_TRUE(families.insert(family).second) << "twice: " << family;
      continue;
    }
    if (std::regex_match(line, m, type)) {
      EXPECT_EQ(m[1], family) << "TYPE without its HELP: " << line;
      family_type = m[2];
      if (family_type == "counter") {
        EXPECT_THAT(family, testing::EndsWith("_total"));
      } else {
        EXPECT_THAT(family, Not(testing::EndsWith("_total")));
      }
      continue;
    }
    ASSERT_TRUE(std::regex_match(line, m, sample)) << "bad line: " << line;
    const std::string name = m[1];
    if (family_type == "histogram") {
      EXPECT_TRUE(name == family + "_bucket" || name == family + "_sum" ||
                  name == family + "_count")
          << line;
    } else {
      EXPECT_EQ(name, family) << "sample outside its family: " << line;
    }
  }
  EXPECT_TRUE(families.count("fedlearn_round_duration_seconds"));
  EXPECT_TRUE(families.count("fedlearn_aggregation_duration_seconds"));
  EXPECT_TRUE(families.count("fedlearn_received_bytes_total"));
}

TEST(PrometheusTest, ReportsTheSnapshot) {
  const std::string text =
      RenderPrometheus(TrainingStatus(), TrainingCounters(), Transfers());
  for (const char* line : {
           R"(fedlearn_info{run_id="run\"1\\",model="mlp_2nn"} 1)",
           "fedlearn_model_parameters 199210",
           R"(fedlearn_phase{phase="waiting_for_clients"} 0)",
           R"(fedlearn_phase{phase="training"} 1)",
           R"(fedlearn_phase{phase="done"} 0)",
           "fedlearn_round 3",
           "fedlearn_rounds_completed_total 2",
           "fedlearn_rounds_abandoned_total 1",
           "fedlearn_evaluations_abandoned_total 4",
           "fedlearn_clients_joined_total 4",
           R"(fedlearn_clients{state="ready"} 1)",
           R"(fedlearn_clients{state="training"} 2)",
           R"(fedlearn_clients{state="evaluating"} 0)",
           R"(fedlearn_clients{state="gone"} 1)",
           "fedlearn_round_selected_clients 3",
           "fedlearn_round_responded_clients 1",
           "fedlearn_updates_accepted_total 8",
           R"(fedlearn_updates_rejected_total{reason="stale_round"} 1)",
           R"(fedlearn_updates_rejected_total{reason="duplicate"} 2)",
           R"(fedlearn_updates_rejected_total{reason="invalid"} 0)",
           "fedlearn_received_bytes_total 3600",
           "fedlearn_sent_bytes_total 10800",
           "fedlearn_downloads 3",
           "fedlearn_download_versions 2",
           "fedlearn_download_version_bytes 1593680",
           R"(fedlearn_downloads_cut_off_total{reason="stalled"} 5)",
           R"(fedlearn_downloads_cut_off_total{reason="moved_on"} 7)",
           "fedlearn_receive_buffers 4",
           "fedlearn_receive_buffers_in_use 1",
           "fedlearn_uploads_waiting 2",
           // Cumulative buckets: 0.5 | 30 | 1000 (above the last bound).
           R"(fedlearn_round_duration_seconds_bucket{le="1"} 1)",
           R"(fedlearn_round_duration_seconds_bucket{le="20"} 1)",
           R"(fedlearn_round_duration_seconds_bucket{le="30"} 2)",
           R"(fedlearn_round_duration_seconds_bucket{le="600"} 2)",
           R"(fedlearn_round_duration_seconds_bucket{le="+Inf"} 3)",
           "fedlearn_round_duration_seconds_sum 1030.5",
           "fedlearn_round_duration_seconds_count 3",
           R"(fedlearn_aggregation_duration_seconds_bucket{le="0.0025"} 1)",
           "fedlearn_aggregation_duration_seconds_count 1",
           // The last closed round (2, attempt 2), not the abandoned one.
           "fedlearn_train_loss 1",
           "fedlearn_train_accuracy_ratio 0.75",
           "fedlearn_validation_loss 1.25",
           "fedlearn_validation_accuracy_ratio 0.8",
       }) {
    EXPECT_THAT(Lines(text), testing::Contains(line)) << text;
  }
  // No final evaluation yet.
  EXPECT_THAT(text, Not(HasSubstr("fedlearn_test_accuracy_ratio")));
}

TEST(PrometheusTest, FinalEvaluationOnceDone) {
  v1::GetStatusResponse s = TrainingStatus();
  s.set_phase(v1::PHASE_DONE);
  s.clear_current_round();
  s.mutable_final_evaluation()->set_test_loss(0.0625);
  s.mutable_final_evaluation()->set_test_accuracy(0.97);
  const std::vector<std::string> lines =
      Lines(RenderPrometheus(s, TrainingCounters(), Transfers()));
  EXPECT_THAT(lines, testing::Contains("fedlearn_test_accuracy_ratio 0.97"));
  EXPECT_THAT(lines, testing::Contains("fedlearn_test_loss 0.0625"));
  EXPECT_THAT(lines, testing::Contains(R"(fedlearn_phase{phase="done"} 1)"));
  EXPECT_THAT(lines, testing::Contains("fedlearn_round_selected_clients 0"));
}

TEST(HistoryCsvTest, OneRowPerRecordWithBlanksForWhatDoesNotApply) {
  v1::GetStatusResponse s = TrainingStatus();
  *s.add_history() = Round(2, "all", 0.125, /*evaluation=*/true);
  const std::vector<std::string> rows =
      absl::StrSplit(RenderHistoryCsv(s), "\r\n", absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0],
            "round,attempt,kind,outcome,selected,responded,dropped,rejected,"
            "train_loss,train_accuracy,validation_loss,validation_accuracy,"
            "test_loss,test_accuracy,num_examples,duration_seconds,"
            "relative_improvement,bytes_received,bytes_sent,dp_epsilon");
  EXPECT_EQ(rows[1], "1,1,training,all,3,3,0,0,2,0.75,,,,,300,1.5,,1200,3600,");
  // Abandoned: no metrics that could be mistaken for a round's.
  EXPECT_EQ(rows[2],
            "2,1,training,abandoned,3,1,2,0,,,,,,,300,1.5,,1200,3600,");
  EXPECT_EQ(rows[3],
            "2,2,training,quorum,3,3,0,0,1,0.75,1.25,0.8,,,300,1.5,0.5,1200,"
            "3600,");
  EXPECT_EQ(rows[4],
            "2,1,evaluation,all,3,3,0,0,,,,,0.125,0.75,300,1.5,,1200,3600,");
}

TEST(HistoryCsvTest, PrivateRoundsCarryTheirEpsilon) {
  v1::GetStatusResponse s = TrainingStatus();
  s.mutable_history(0)->set_dp_noise_multiplier(1.0);
  s.mutable_history(0)->set_dp_epsilon(0.5);
  const std::vector<std::string> rows =
      absl::StrSplit(RenderHistoryCsv(s), "\r\n", absl::SkipEmpty());
  ASSERT_GE(rows.size(), 2u);
  EXPECT_EQ(rows[1],
            "1,1,training,all,3,3,0,0,2,0.75,,,,,300,1.5,,1200,3600,0.5");
}

TEST(PrometheusTest, PrivacyGaugesOnlyUnderDp) {
  v1::GetStatusResponse s = TrainingStatus();
  EXPECT_THAT(RenderPrometheus(s, TrainingCounters(), Transfers()),
              testing::Not(testing::HasSubstr("fedlearn_dp_")));
  s.mutable_privacy()->set_epsilon(1.25);
  s.mutable_privacy()->set_delta(1e-5);
  s.mutable_privacy()->set_max_epsilon(8);
  s.mutable_privacy()->set_rounds(7);
  const std::vector<std::string> lines =
      Lines(RenderPrometheus(s, TrainingCounters(), Transfers()));
  EXPECT_THAT(lines, testing::Contains("fedlearn_dp_epsilon 1.25"));
  EXPECT_THAT(lines, testing::Contains("fedlearn_dp_delta 1e-05"));
  EXPECT_THAT(lines, testing::Contains("fedlearn_dp_max_epsilon 8"));
  EXPECT_THAT(lines, testing::Contains("fedlearn_dp_rounds_total 7"));
}

TEST(TensorStatsTest, MatchesHandComputedValues) {
  auto spec = MakeModelSpec("tiny", {{"w", {2, 2}, Init::kGlorotUniform, 2, 2},
                                     {"b", {3}, Init::kZeros}});
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::vector<float> weights = {1, 2, 3, 4, 0.5f, 0.5f, 0.5f};
  const std::vector<TensorStats> stats =
      ComputeTensorStats(*spec, weights, /*bins=*/3);
  ASSERT_EQ(stats.size(), 2u);
  const TensorStats& w = stats[0];
  EXPECT_EQ(w.name, "w");
  EXPECT_THAT(w.shape, ElementsAre(2, 2));
  EXPECT_EQ(w.count, 4);
  EXPECT_DOUBLE_EQ(w.l2, std::sqrt(30.0));
  EXPECT_DOUBLE_EQ(w.mean, 2.5);
  EXPECT_DOUBLE_EQ(w.std, std::sqrt(1.25));
  EXPECT_EQ(w.min, 1);
  EXPECT_EQ(w.max, 4);
  // Bins of width 1 over [1, 4]; the last bin takes its upper edge.
  EXPECT_THAT(w.histogram, ElementsAre(1, 1, 2));
  const TensorStats& b = stats[1];
  EXPECT_DOUBLE_EQ(b.std, 0);
  EXPECT_THAT(b.histogram, ElementsAre(3, 0, 0));  // constant: all in bin 0
}

TEST(TensorStatsTest, JsonParsesBackToTheStatistics) {
  auto spec = MakeModelSpec("tiny", {{"w", {2, 2}, Init::kGlorotUniform, 2, 2},
                                     {"b", {3}, Init::kZeros}});
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::vector<float> weights = {1, 2, 3, 4, 0.5f, 0.5f, 0.5f};
  const std::string json =
      TensorStatsJson(7, ComputeTensorStats(*spec, weights, 3));
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok())
      << json;
  EXPECT_EQ(parsed.fields().at("round").number_value(), 7);
  const auto& tensors = parsed.fields().at("tensors").list_value();
  ASSERT_EQ(tensors.values_size(), 2);
  const auto& w = tensors.values(0).struct_value().fields();
  EXPECT_EQ(w.at("name").string_value(), "w");
  EXPECT_EQ(w.at("count").number_value(), 4);
  EXPECT_NEAR(w.at("l2").number_value(), std::sqrt(30.0), 1e-7);
  EXPECT_EQ(w.at("shape").list_value().values(1).number_value(), 2);
  const auto& histogram = w.at("histogram").struct_value().fields();
  EXPECT_EQ(histogram.at("lo").number_value(), 1);
  EXPECT_EQ(histogram.at("hi").number_value(), 4);
  EXPECT_EQ(histogram.at("counts").list_value().values(2).number_value(), 2);
}

}  // namespace
}  // namespace fedlearn
