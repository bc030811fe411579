#include "server/evaluation_phase.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;

const absl::Time t0 = absl::FromUnixSeconds(1'000'000);

v1::ReportEvalRequest Report(const std::string& id, int64_t round, double loss,
                             double accuracy, int64_t examples) {
  v1::ReportEvalRequest r;
  r.set_client_id(id);
  r.set_round(round);
  r.set_test_loss(loss);
  r.set_test_accuracy(accuracy);
  r.set_num_examples(examples);
  return r;
}

TEST(EvaluationPhaseTest, AsksEveryClientAndAggregatesByTestSize) {
  EvaluationPhase phase(0.3, absl::Seconds(30));
  auto weights = std::make_shared<const std::vector<float>>(4, 1.0f);
  auto posts = phase.Open(5, {"a", "b", "c"}, weights, t0);
  ASSERT_EQ(posts.size(), 3u);
  EXPECT_EQ(posts[0].second.type, v1::TASK_TYPE_EVALUATE);
  EXPECT_EQ(posts[0].second.round, 5);
  EXPECT_EQ(posts[0].second.weights, weights);
  EXPECT_EQ(phase.deadline(), t0 + absl::Seconds(30));
  EXPECT_EQ(*phase.Report(Report("a", 5, 0.2, 0.9, 100)), "");
  // Quorum of 3 at tolerance 0.3 is 3: ceil(2.1).
  EXPECT_EQ(*phase.Report(Report("b", 5, 0.6, 0.5, 300)), "");
  EXPECT_EQ(*phase.Report(Report("c", 5, 0.4, 0.7, 100)), "all");
  EvaluationPhase::Closed closed = phase.Close("all", t0 + absl::Seconds(4));
  ASSERT_TRUE(closed.result.has_value());
  // (0.9 * 100 + 0.5 * 300 + 0.7 * 100) / 500
  EXPECT_DOUBLE_EQ(closed.result->test_accuracy(), 0.62);
  EXPECT_DOUBLE_EQ(closed.result->test_loss(), 0.48);
  EXPECT_EQ(closed.result->num_examples(), 500);
  EXPECT_EQ(closed.result->num_clients(), 3);
  EXPECT_TRUE(closed.record.evaluation());
  EXPECT_FALSE(phase.is_open());
}

TEST(EvaluationPhaseTest, RejectsBadReportsAndChangesNothing) {
  EvaluationPhase phase(0.0, absl::Seconds(30));
  EXPECT_EQ(phase.Report(Report("a", 1, 0.1, 0.9, 10)).status().code(),
            absl::StatusCode::kFailedPrecondition);  // nothing open
  phase.Open(1, {"a", "b"}, nullptr, t0);
  EXPECT_THAT(phase.Report(Report("a", 2, 0.1, 0.9, 10)).status().message(),
              HasSubstr("final weights are round 1's"));
  EXPECT_THAT(phase.Report(Report("z", 1, 0.1, 0.9, 10)).status().message(),
              HasSubstr("not asked to evaluate"));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(phase.Report(Report("a", 1, nan, 0.9, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(phase.Report(Report("a", 1, 0.1, 1.5, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(phase.Report(Report("a", 1, 0.1, 0.9, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(phase.cohort()->answered(), 0);
  ASSERT_TRUE(phase.Report(Report("a", 1, 0.1, 0.9, 10)).ok());
  EXPECT_EQ(phase.Report(Report("a", 1, 0.1, 0.9, 10)).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(EvaluationPhaseTest, AnAbandonedAttemptHasNoResultAndTheNextIsCounted) {
  EvaluationPhase phase(0.3, absl::Seconds(30));
  phase.Open(3, {"a", "b", "c", "d"}, nullptr, t0);
  ASSERT_TRUE(phase.Report(Report("a", 3, 0.1, 0.9, 10)).ok());
  EvaluationPhase::Closed closed =
      phase.Close("abandoned", t0 + absl::Seconds(30));
  EXPECT_FALSE(closed.result.has_value());
  EXPECT_EQ(closed.record.responded(), 1);
  EXPECT_EQ(closed.record.dropped(), 3);
  phase.Open(3, {"a", "b"}, nullptr, t0 + absl::Seconds(30));
  EXPECT_EQ(phase.cohort()->number(), 2);
}

// A closed attempt cuts off the EVALUATE downloads still running, as their
// reports could no longer count; a task of another round is not its own.
TEST(EvaluationPhaseTest, AClosedAttemptCutsOffItsDownloads) {
  EvaluationPhase phase(0.3, absl::Seconds(30));
  auto posts = phase.Open(3, {"a", "b", "c"}, nullptr, t0);
  ASSERT_EQ(posts.size(), 3u);
  Task evaluate = posts[0].second;
  evaluate.retire = std::make_shared<CancelHandle>();
  phase.NoteSent(evaluate, 400);
  Task other = posts[1].second;
  other.round = 2;
  other.retire = std::make_shared<CancelHandle>();
  phase.NoteSent(other, 400);
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(phase.Report(Report(id, 3, 0.1, 0.9, 10)).ok());
  }
  EvaluationPhase::Closed closed = phase.Close("all", t0 + absl::Seconds(1));
  ASSERT_EQ(closed.cancel.size(), 1u);
  EXPECT_EQ(closed.cancel[0], evaluate.retire);
  EXPECT_EQ(closed.record.bytes_sent(), 800);
}

}  // namespace
}  // namespace fedlearn
