#include "server/cohort.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;

const absl::Time kStart = absl::FromUnixSeconds(1000);

Cohort Ten(double tolerance = 0.3) {
  std::vector<std::string> ids;
  for (int i = 0; i < 10; ++i) ids.push_back("c" + std::to_string(i));
  return Cohort(/*round=*/4, /*number=*/2, std::move(ids), tolerance, kStart,
                kStart + absl::Seconds(30));
}

AnswerMetrics Answer(int64_t examples, double loss, int64_t bytes = 0) {
  AnswerMetrics a;
  a.num_examples = examples;
  a.loss = loss;
  a.bytes = bytes;
  return a;
}

TEST(CohortTest, QuorumToleratesTheGivenShareSilent) {
  // DESIGN.md's example: 10 selected, 30% tolerated, 7 close the round;
  // (1 - 0.3) * 10 is 7.000000000000001 in double and must not become 8.
  EXPECT_EQ(Cohort::Quorum(10, 0.3), 7);
  EXPECT_EQ(Cohort::Quorum(100, 0.3), 70);
  EXPECT_EQ(Cohort::Quorum(1000, 0.3), 700);
  // Rounded up: 3 selected tolerating 30% (0.9 of a client) need all 3.
  EXPECT_EQ(Cohort::Quorum(3, 0.3), 3);
  EXPECT_EQ(Cohort::Quorum(4, 0.3), 3);
  EXPECT_EQ(Cohort::Quorum(7, 0.0), 7);
  // Never below one answer, never above the cohort.
  EXPECT_EQ(Cohort::Quorum(10, 1.0), 1);
  EXPECT_EQ(Cohort::Quorum(1, 0.3), 1);
  EXPECT_EQ(Cohort::Quorum(0, 0.3), 1);
  EXPECT_EQ(Ten().quorum(), 7);
}

TEST(CohortTest, ClosesAtQuorumThenWithEveryAnswer) {
  Cohort cohort = Ten();
  for (int i = 0; i < 6; ++i) {
    cohort.Add("c" + std::to_string(i), Answer(10, 1.0));
    EXPECT_EQ(cohort.Outcome(), "") << i;
  }
  cohort.Add("c6", Answer(10, 1.0));
  EXPECT_EQ(cohort.Outcome(), "quorum");
  cohort.Add("c7", Answer(10, 1.0));
  cohort.Add("c8", Answer(10, 1.0));
  EXPECT_EQ(cohort.Outcome(), "quorum");
  cohort.Add("c9", Answer(10, 1.0));
  EXPECT_EQ(cohort.Outcome(), "all");
  EXPECT_EQ(cohort.answered(), 10);
}

TEST(CohortTest, ASuccessorTakesAGoneClientsPlaceAndKeepsTheQuorum) {
  Cohort cohort = Ten();
  cohort.Add("c0", Answer(10, 1.0));
  EXPECT_TRUE(cohort.Replace("c3", "c3-again"));
  EXPECT_FALSE(cohort.IsSelected("c3"));
  EXPECT_TRUE(cohort.IsSelected("c3-again"));
  EXPECT_EQ(cohort.selected().size(), 10u);
  EXPECT_EQ(cohort.selected()[3], "c3-again") << "in the gone client's place";
  EXPECT_EQ(cohort.quorum(), 7);

  // Refused, changing nothing: a client that has answered keeps its place, an
  // unselected one has none, and a successor selected already cannot take a
  // second.
  EXPECT_FALSE(cohort.Replace("c0", "c0-again"));
  EXPECT_FALSE(cohort.Replace("stranger", "s-again"));
  EXPECT_FALSE(cohort.Replace("c4", "c5"));
  EXPECT_FALSE(cohort.Replace("c3", "c3-third"));  // no longer selected
  EXPECT_TRUE(cohort.IsSelected("c0"));
  EXPECT_TRUE(cohort.IsSelected("c4"));
  EXPECT_FALSE(cohort.IsSelected("c0-again"));
  EXPECT_FALSE(cohort.IsSelected("s-again"));
  EXPECT_EQ(cohort.selected().size(), 10u);

  // The successor's answer counts like the one it replaced.
  for (const char* id : {"c1", "c2", "c3-again", "c4", "c5", "c6"}) {
    cohort.Add(id, Answer(10, 1.0));
  }
  EXPECT_EQ(cohort.Outcome(), "quorum");
}

TEST(CohortTest, RecordListsClientsInOrderAndWeighsMetricsByExamples) {
  Cohort cohort = Ten();
  cohort.NoteSent(Task(), 1234);
  cohort.Add("c5", Answer(100, 0.5, /*bytes=*/2000));
  cohort.Add("c2", Answer(300, 0.1, /*bytes=*/3000));
  const v1::RoundRecord record =
      cohort.Record("abandoned", kStart + absl::Milliseconds(2500),
                    /*dropped=*/3);
  EXPECT_EQ(record.round(), 4);
  EXPECT_EQ(record.attempt(), 2);
  EXPECT_EQ(record.selected(), 10);
  EXPECT_EQ(record.selected_clients_size(), 10);
  EXPECT_EQ(record.selected_clients(0), "c0");
  EXPECT_THAT(record.accepted_clients(), ElementsAre("c5", "c2"));
  EXPECT_EQ(record.responded(), 2);
  EXPECT_EQ(record.dropped(), 3);
  EXPECT_EQ(record.outcome(), "abandoned");
  EXPECT_DOUBLE_EQ(record.duration_seconds(), 2.5);
  EXPECT_EQ(record.bytes_sent(), 1234);
  EXPECT_EQ(record.bytes_received(), 5000);
  EXPECT_EQ(record.metrics().num_examples(), 400);
  // (100 * 0.5 + 300 * 0.1) / 400, by hand.
  EXPECT_DOUBLE_EQ(record.metrics().train_loss(), 0.2);
}

TEST(CohortTest, HandsOverItsPushesInFlightOnce) {
  Cohort cohort = Ten();
  int cancelled = 0;
  auto handle = std::make_shared<CancelHandle>([&cancelled] { ++cancelled; });
  cohort.Track(handle);
  std::vector<std::shared_ptr<CancelHandle>> taken = cohort.TakeInFlight();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0], handle);
  EXPECT_TRUE(cohort.TakeInFlight().empty());
  taken[0]->Cancel();
  taken[0]->Cancel();
  EXPECT_EQ(cancelled, 1);
}

TEST(InFlightCallsTest, LetsGoOfEndedPushesAsItGrows) {
  InFlightCalls pushes;
  // One push stays in flight (the test holds it); a thousand others open and
  // end (only the list holds them).
  auto held = std::make_shared<CancelHandle>([] {});
  pushes.Track(held);
  for (int i = 0; i < 1000; ++i) {
    pushes.Track(std::make_shared<CancelHandle>([] {}));
    // At most twice what is really in flight, plus 16 (task.h).
    ASSERT_LE(pushes.size(), 2 * 2 + 16u) << i;
  }
  std::vector<std::shared_ptr<CancelHandle>> taken = pushes.Take();
  EXPECT_NE(std::find(taken.begin(), taken.end(), held), taken.end())
      << "a push still in flight is never let go of";
  EXPECT_EQ(pushes.size(), 0u);
}

}  // namespace
}  // namespace fedlearn
