#include "server/sync_scheduler.h"

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
using ::testing::HasSubstr;
using ::testing::Optional;

const absl::Time t0 = absl::FromUnixSeconds(1'000'000);

SyncScheduler::Options TenOfTen() {
  SyncScheduler::Options o;
  o.min_clients = 2;
  o.clients_per_round = 10;
  o.tolerance = 0.3;
  o.round_timeout = absl::Seconds(60);
  o.rounds_between_validations = 2;
  return o;
}

std::vector<std::string> Ids(int n) {
  std::vector<std::string> ids;
  for (int i = 1; i <= n; ++i) ids.push_back("client-" + std::to_string(i));
  return ids;
}

v1::UpdateHeader Header(const std::string& id, int64_t round,
                        int64_t examples = 100, double loss = 1.0) {
  v1::UpdateHeader h;
  h.set_client_id(id);
  h.set_round(round);
  h.set_num_examples(examples);
  h.set_train_loss(loss);
  return h;
}

std::shared_ptr<CancelHandle> Handle() {
  return std::make_shared<CancelHandle>([] {});
}

TEST(SyncSchedulerTest, CohortSizeFollowsTheRoundRules) {
  SyncScheduler::Options o = TenOfTen();
  EXPECT_EQ(SyncScheduler(o).WantClients(1), std::nullopt);  // < min_clients
  EXPECT_THAT(SyncScheduler(o).WantClients(4), Optional(4));
  EXPECT_THAT(SyncScheduler(o).WantClients(40), Optional(10));
  o.over_selection = 1.3;
  EXPECT_THAT(SyncScheduler(o).WantClients(40), Optional(13));
  EXPECT_THAT(SyncScheduler(o).WantClients(11), Optional(11));
  o.clients_per_round = 0;
  o.fraction = 0.25;
  o.over_selection = 1;
  EXPECT_THAT(SyncScheduler(o).WantClients(40), Optional(10));
  EXPECT_THAT(SyncScheduler(o).WantClients(4), Optional(2));  // min_clients
}

TEST(SyncSchedulerTest, OpenPostsTrainToTheSampledWithTheDeadline) {
  SyncScheduler s(TenOfTen());
  auto weights = std::make_shared<const std::vector<float>>(3, 0.5f);
  auto plan = std::make_shared<const v1::TrainingPlan>();
  Opening o = s.Open(Ids(3), weights, plan, /*version=*/1, t0);
  ASSERT_EQ(o.posts.size(), 3u);
  const Task& train = o.posts[0].second;
  EXPECT_EQ(train.type, v1::TASK_TYPE_TRAIN);
  EXPECT_EQ(train.round, 2);
  EXPECT_TRUE(train.run_validation);  // every 2nd round
  EXPECT_EQ(train.deadline, t0 + absl::Seconds(60));
  EXPECT_EQ(train.weights, weights);
  EXPECT_EQ(train.plan, plan);
  EXPECT_EQ(o.default_task.type, v1::TASK_TYPE_WAIT);
  EXPECT_EQ(s.deadline(), t0 + absl::Seconds(60));
  EXPECT_THAT(o.log, HasSubstr("quorum 3"));
}

TEST(SyncSchedulerTest, AdmitsOnlyTheSelectedForTheOpenRoundOnce) {
  SyncScheduler s(TenOfTen());
  s.Open(Ids(3), nullptr, nullptr, 0, t0);
  Rejection why;
  auto stale = s.Admit(Header("client-1", 2), Handle(), 0, &why);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(why, Rejection::kStaleRound);
  auto outsider = s.Admit(Header("client-9", 1), Handle(), 0, &why);
  EXPECT_EQ(outsider.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(why, Rejection::kNotSelected);
  auto ticket = s.Admit(Header("client-1", 1), Handle(), 0, &why);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(s.Accept(*ticket, Header("client-1", 1), 10, 0, t0, &why).ok());
  auto again = s.Admit(Header("client-1", 1), Handle(), 0, &why);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(why, Rejection::kDuplicate);
}

TEST(SyncSchedulerTest, TwoConcurrentPushesOfOneClientCountOnce) {
  SyncScheduler s(TenOfTen());
  s.Open(Ids(3), nullptr, nullptr, 0, t0);
  Rejection why;
  auto first = s.Admit(Header("client-2", 1), Handle(), 0, &why);
  auto second = s.Admit(Header("client-2", 1), Handle(), 0, &why);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(s.Accept(*first, Header("client-2", 1), 10, 0, t0, &why).ok());
  auto lost = s.Accept(*second, Header("client-2", 1), 10, 0, t0, &why);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kAlreadyExists);
}

// A client that re-joins saying who it was takes its own place in the round;
// a push its old identity had under way no longer counts, so one place never
// yields two updates (a vote each for a robust rule, two shares of the DP
// sensitivity).
TEST(SyncSchedulerTest, APushOfAReplacedIdentityIsNotCounted) {
  SyncScheduler s(TenOfTen());
  s.Open(Ids(3), nullptr, nullptr, 0, t0);
  Rejection why;
  auto old_push = s.Admit(Header("client-2", 1), Handle(), 0, &why);
  ASSERT_TRUE(old_push.ok());
  ASSERT_TRUE(s.Replace("client-2", "client-2b").has_value());
  auto late = s.Accept(*old_push, Header("client-2", 1), 10, 0, t0, &why);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(why, Rejection::kNotSelected);
  EXPECT_THAT(late.status().message(), HasSubstr("client-2: "));
  auto successor = s.Admit(Header("client-2b", 1), Handle(), 0, &why);
  ASSERT_TRUE(successor.ok());
  auto counted = s.Accept(*successor, Header("client-2b", 1), 10, 0, t0, &why);
  ASSERT_TRUE(counted.ok());
  EXPECT_EQ(counted->accepted, 1);
}

TEST(CancelHandleTest, ArmedAfterItWasCancelledItCancelsAtOnce) {
  int runs = 0;
  CancelHandle late;  // a download's, cancelled before its stream armed it
  late.Cancel();
  late.Arm([&runs] { ++runs; });
  EXPECT_EQ(runs, 1);
  CancelHandle armed;
  armed.Arm([&runs] { ++runs; });
  EXPECT_EQ(runs, 1);
  armed.Cancel();
  armed.Cancel();
  EXPECT_EQ(runs, 2);  // once
  CancelHandle disarmed;
  disarmed.Arm([&runs] { ++runs; });
  disarmed.Disarm();
  disarmed.Cancel();
  EXPECT_EQ(runs, 2);
}

// A selected client that opens pushes and abandons them all round long (each
// admitted again, since it has not answered) must not grow the round's list
// of pushes to cut off: ended ones are let go of.
TEST(InFlightCallsTest, EndedPushesAreLetGoOfAndLiveOnesKept) {
  InFlightCalls pushes;
  std::vector<std::shared_ptr<CancelHandle>> live;
  for (int i = 0; i < 3; ++i) {
    live.push_back(Handle());
    pushes.Track(live.back());
  }
  for (int i = 0; i < 100000; ++i) pushes.Track(Handle());  // ended at once
  EXPECT_LE(pushes.size(), 2 * live.size() + 16 + 1);
  int cancelled = 0;
  for (int i = 0; i < 2; ++i) {
    auto counted =
        std::make_shared<CancelHandle>([&cancelled] { ++cancelled; });
    live.push_back(counted);
    pushes.Track(counted);
  }
  const std::vector<std::shared_ptr<CancelHandle>> taken = pushes.Take();
  for (const auto& h : live) {
    EXPECT_NE(std::find(taken.begin(), taken.end(), h), taken.end());
  }
  for (const auto& h : taken) h->Cancel();
  EXPECT_EQ(cancelled, 2);
  EXPECT_EQ(pushes.size(), 0u);
}

TEST(SyncSchedulerTest, ClosesAtQuorumWeighingUpdatesByExamples) {
  SyncScheduler s(TenOfTen());
  s.Open(Ids(10), nullptr, nullptr, 0, t0);
  Rejection why;
  for (int i = 1; i <= 7; ++i) {
    const std::string id = "client-" + std::to_string(i);
    auto ticket = s.Admit(Header(id, 1, 10 * i, i), Handle(), 0, &why);
    ASSERT_TRUE(ticket.ok());
    auto accepted =
        s.Accept(*ticket, Header(id, 1, 10 * i, i), 100, 0, t0, &why);
    ASSERT_TRUE(accepted.ok());
    EXPECT_EQ(accepted->weight, 10.0 * i);
    EXPECT_EQ(accepted->scale, 1.0);
    EXPECT_EQ(accepted->accepted, i);
    EXPECT_EQ(accepted->outcome, i == 7 ? "quorum" : "") << i;
  }
  Closing c = s.Close("quorum", 0, 10, t0 + absl::Seconds(3));
  EXPECT_FALSE(s.is_open());
  EXPECT_EQ(c.record.round(), 1);
  EXPECT_EQ(c.record.selected(), 10);
  EXPECT_EQ(c.record.responded(), 7);
  EXPECT_EQ(c.record.dropped(), 3);
  EXPECT_EQ(c.record.duration_seconds(), 3.0);
  EXPECT_EQ(c.record.bytes_received(), 700);
  EXPECT_THAT(c.record.accepted_clients(),
              ElementsAre("client-1", "client-2", "client-3", "client-4",
                          "client-5", "client-6", "client-7"));
  // The loss weighted by examples: sum(10i * i) / sum(10i), i = 1..7.
  EXPECT_THAT(c.loss, Optional(140.0 / 28.0));
  EXPECT_TRUE(c.save);
}

TEST(SyncSchedulerTest, AClosedRoundCutsItsPushesOffAndRejectsTheirCommits) {
  SyncScheduler s(TenOfTen());
  s.Open(Ids(4), nullptr, nullptr, 0, t0);
  Rejection why;
  auto ticket = s.Admit(Header("client-4", 1), Handle(), 0, &why);
  ASSERT_TRUE(ticket.ok());
  Closing c = s.Close("abandoned", 0, 4, t0 + absl::Seconds(60));
  EXPECT_EQ(c.loss, std::nullopt);  // nothing to judge convergence on
  ASSERT_EQ(c.cancel.size(), 1u);
  EXPECT_EQ(c.cancel[0], ticket->cancel);
  // The retry is attempt 2 of the same round; the old ticket cannot count.
  Opening retry = s.Open(Ids(4), nullptr, nullptr, 0, t0 + absl::Seconds(60));
  EXPECT_THAT(retry.log, HasSubstr("attempt 2"));
  auto late = s.Accept(*ticket, Header("client-4", 1), 10, 0, t0, &why);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(why, Rejection::kStaleRound);
}

TEST(SyncSchedulerTest, AClosedRoundCutsOffItsDownloadsOnly) {
  SyncScheduler s(TenOfTen());
  Opening o = s.Open(Ids(4), nullptr, nullptr, 0, t0);
  // Client 1's TRAIN, as the controller hands it out with a retire handle.
  Task train = o.posts[0].second;
  train.retire = Handle();
  s.NoteSent(o.posts[0].first, train, 400);
  // A task of another round is not this round's to cut off.
  Task other = train;
  other.round = 7;
  other.retire = Handle();
  s.NoteSent(o.posts[1].first, other, 400);
  Closing c = s.Close("abandoned", 0, 4, t0 + absl::Seconds(60));
  ASSERT_EQ(c.cancel.size(), 1u);
  EXPECT_EQ(c.cancel[0], train.retire);
}

TEST(SyncSchedulerTest, OpenRecordCountsTheGoneAsDropped) {
  SyncScheduler s(TenOfTen());
  const auto gone = [](const std::string& id) { return id == "client-2"; };
  EXPECT_EQ(s.OpenRecord(t0, gone, true), std::nullopt);
  s.Open(Ids(3), nullptr, nullptr, 0, t0);
  auto record = s.OpenRecord(t0 + absl::Seconds(1), gone, /*client_ids=*/true);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->outcome(), "open");
  EXPECT_EQ(record->dropped(), 1);
  EXPECT_EQ(record->selected_clients_size(), 3);
  // Without ids, the same counts and no copy of the ids.
  record = s.OpenRecord(t0 + absl::Seconds(1), gone, /*client_ids=*/false);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->selected(), 3);
  EXPECT_EQ(record->dropped(), 1);
  EXPECT_EQ(record->selected_clients_size(), 0);
  EXPECT_TRUE(s.IsTraining("client-2"));
  EXPECT_FALSE(s.IsTraining("client-7"));
}

}  // namespace
}  // namespace fedlearn
