#include "server/async_scheduler.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;
using ::testing::UnorderedElementsAre;

const absl::Time t0 = absl::FromUnixSeconds(1'000'000);

AsyncScheduler::Options Buffered(int k) {
  AsyncScheduler::Options o;
  o.min_clients = 2;
  o.buffer = k;
  o.mixing = 0.5;
  o.staleness_exponent = 1.0;  // scale = 0.5 / (1 + staleness)
  return o;
}

v1::UpdateHeader Header(const std::string& id, int64_t round,
                        double loss = 1.0) {
  v1::UpdateHeader h;
  h.set_client_id(id);
  h.set_round(round);
  h.set_num_examples(100);
  h.set_train_loss(loss);
  return h;
}

std::shared_ptr<CancelHandle> Handle() {
  return std::make_shared<CancelHandle>([] {});
}

// Sends `id` the open step's TRAIN, as the controller does when it polls.
void Send(AsyncScheduler& s, const Opening& o, const std::string& id) {
  s.NoteSent(id, o.default_task, 400);
}

// Sends `id` the open step's TRAIN with a retire handle, as the controller
// does; the handle is returned to see where the scheduler hands it back.
std::shared_ptr<CancelHandle> SendWithRetire(AsyncScheduler& s,
                                             const Opening& o,
                                             const std::string& id) {
  Task train = o.default_task;
  train.retire = Handle();
  s.NoteSent(id, train, 400);
  return train.retire;
}

// Sends `id` the open step's TRAIN for `round`, and admits and accepts its
// update at `version` and `at`; the acceptance.
absl::StatusOr<Acceptance> SendAndAccept(AsyncScheduler& s, const Opening& o,
                                         const std::string& id, int64_t round,
                                         int64_t version, absl::Time at = t0) {
  Send(s, o, id);
  Rejection why;
  absl::StatusOr<Ticket> ticket =
      s.Admit(Header(id, round), Handle(), version, &why);
  if (!ticket.ok()) return ticket.status();
  return s.Accept(*ticket, Header(id, round), 10, version, at, &why);
}

TEST(AsyncSchedulerTest, StartsAtMinClientsThenGoesOnWithWhoeverIsThere) {
  AsyncScheduler s(Buffered(1));
  EXPECT_EQ(s.WantClients(1), std::nullopt);
  EXPECT_THAT(s.WantClients(2), Optional(0));
  Opening o = s.Open({}, nullptr, nullptr, 0, t0);
  EXPECT_TRUE(o.posts.empty());
  EXPECT_EQ(o.default_task.type, v1::TASK_TYPE_TRAIN);
  EXPECT_EQ(o.default_task.round, 1);
  EXPECT_THAT(o.log, HasSubstr("every 1 update"));
  EXPECT_THAT(s.WantClients(1), Optional(0));  // started: no minimum
  EXPECT_EQ(s.deadline(), absl::InfiniteFuture());
}

TEST(AsyncSchedulerTest, EachUpdateMakesAVersionScaledByItsStaleness) {
  AsyncScheduler s(Buffered(1));
  Opening o = s.Open({}, nullptr, nullptr, 0, t0);
  Send(s, o, "a");
  Send(s, o, "b");
  Rejection why;
  auto a = s.Admit(Header("a", 1), Handle(), 0, &why);
  auto b = s.Admit(Header("b", 1), Handle(), 0, &why);
  ASSERT_TRUE(a.ok() && b.ok());
  auto fresh = s.Accept(*a, Header("a", 1), 10, /*version=*/0, t0, &why);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->weight, 1.0);
  EXPECT_EQ(fresh->scale, 0.5);
  EXPECT_EQ(fresh->outcome, "async");
  EXPECT_EQ(fresh->round, 1);
  Closing c = s.Close("async", 0, 2, t0 + absl::Seconds(2));
  EXPECT_EQ(c.record.round(), 1);
  EXPECT_EQ(c.record.staleness(), 0);
  EXPECT_EQ(c.record.update_scale(), 0.5);
  EXPECT_EQ(c.record.duration_seconds(), 2.0);
  EXPECT_EQ(c.record.bytes_sent(), 800);
  EXPECT_EQ(c.loss, std::nullopt);  // the window is 2 updates
  EXPECT_FALSE(c.save);
  s.Open({}, nullptr, nullptr, 1, t0 + absl::Seconds(2));
  // b trained version 0, one version ago: scale 0.5 / 2.
  auto stale = s.Accept(*b, Header("b", 1), 10, /*version=*/1, t0, &why);
  ASSERT_TRUE(stale.ok());
  EXPECT_EQ(stale->scale, 0.25);
  EXPECT_EQ(stale->round, 2);
  c = s.Close("async", 1, 2, t0 + absl::Seconds(3));
  EXPECT_EQ(c.record.staleness(), 1);
  EXPECT_THAT(c.loss, Optional(1.0));  // the window of 2 closed
  EXPECT_TRUE(c.save);
}

// The run is saved once a window of as many updates as alive clients, and
// at least every kMaxUnsavedTime of versions: with 1,000 alive a window is
// 1,000 updates, which a crash would otherwise lose whole.
TEST(AsyncSchedulerTest, ALongWindowIsStillSavedEveryTenSeconds) {
  AsyncScheduler s(Buffered(1));
  ASSERT_EQ(AsyncScheduler::kMaxUnsavedTime, absl::Seconds(10));
  int64_t version = 0;
  Opening o = s.Open({}, nullptr, nullptr, version, t0);
  // Applies one update at `seconds` after t0; whether its close saves.
  auto saves_at = [&](int seconds) {
    const absl::Time at = t0 + absl::Seconds(seconds);
    EXPECT_TRUE(SendAndAccept(s, o, "a", version + 1, version, at).ok());
    const Closing c = s.Close("async", version, /*alive=*/1000, at);
    o = s.Open({}, nullptr, nullptr, ++version, at);
    return c.save;
  };
  EXPECT_FALSE(saves_at(1));
  EXPECT_FALSE(saves_at(9));
  EXPECT_TRUE(saves_at(10));
  EXPECT_FALSE(saves_at(19));
  EXPECT_TRUE(saves_at(21));
}

TEST(AsyncSchedulerTest, ABufferOfKMakesAVersionEveryKUpdates) {
  AsyncScheduler s(Buffered(3));
  Opening o = s.Open({}, nullptr, nullptr, 0, t0);
  Rejection why;
  for (int i = 0; i < 3; ++i) {
    const std::string id = "c" + std::to_string(i);
    Send(s, o, id);
    auto ticket = s.Admit(Header(id, 1, 1.0 + i), Handle(), 0, &why);
    ASSERT_TRUE(ticket.ok());
    auto accepted = s.Accept(*ticket, Header(id, 1, 1.0 + i), 10, 0, t0, &why);
    ASSERT_TRUE(accepted.ok());
    EXPECT_EQ(accepted->outcome, i == 2 ? "async" : "") << i;
    EXPECT_EQ(accepted->round, 1);
  }
  Closing c = s.Close("async", 0, 3, t0);
  EXPECT_EQ(c.record.responded(), 3);
  EXPECT_EQ(c.record.metrics().train_loss(), 2.0);
  EXPECT_THAT(c.loss, Optional(2.0));  // window: 3 alive clients
}

// A step is stranded when every alive client's update is in, and it holds
// at least the strategy's minimum: fewer could not make a version.
TEST(AsyncSchedulerTest, AStepIsStrandedWhenNoAliveClientCanAddAnUpdate) {
  AsyncScheduler s(Buffered(3));
  Opening o = s.Open({}, nullptr, nullptr, 0, t0);
  auto alive = [](const std::string& id) { return id != "dead"; };
  EXPECT_EQ(s.Stranded(1, 2, alive), "");  // no update yet
  for (const std::string id : {"a", "dead"}) {
    ASSERT_TRUE(SendAndAccept(s, o, id, 1, 0).ok());
  }
  EXPECT_EQ(s.Stranded(1, 2, alive), "");  // b, alive, may still push
  EXPECT_EQ(s.Stranded(1, 1, alive), "async");
  EXPECT_EQ(s.Stranded(3, 1, alive), "");  // a rule needing 3 could not
}

// A step abandoned (its aggregate could not be made: a spill file lost)
// applied nothing, and the next step is for the same round: the updates it
// had may come again, rather than be refused as duplicates for good.
TEST(AsyncSchedulerTest, AnAbandonedStepsClientsMayPushItsRoundAgain) {
  AsyncScheduler s(Buffered(2));
  Opening o = s.Open({}, nullptr, nullptr, 0, t0);
  ASSERT_TRUE(SendAndAccept(s, o, "a", 1, 0).ok());
  s.Close("abandoned", 0, 2, t0);
  o = s.Open({}, nullptr, nullptr, 0, t0);
  ASSERT_EQ(o.default_task.round, 1);
  absl::StatusOr<Acceptance> accepted = SendAndAccept(s, o, "a", 1, 0);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(accepted->accepted, 1);
}

// With a buffer of K, K updates are K clients': a client whose update is in
// waits for the next version (it is not handed the same one to train again),
// and a second push for the same version is a duplicate, even after a lost
// reply and a new task for that version; a push admitted for one task is not
// accepted once the client has taken another.
TEST(AsyncSchedulerTest, ABufferTakesOneUpdatePerClientAndVersion) {
  AsyncScheduler s(Buffered(3));
  Opening o = s.Open({}, nullptr, nullptr, 0, t0);
  Rejection why;
  Send(s, o, "a");
  auto first = s.Admit(Header("a", 1), Handle(), 0, &why);
  auto twin = s.Admit(Header("a", 1), Handle(), 0, &why);  // same task
  ASSERT_TRUE(first.ok() && twin.ok());
  auto accepted = s.Accept(*first, Header("a", 1), 10, 0, t0, &why);
  ASSERT_TRUE(accepted.ok());
  EXPECT_TRUE(accepted->wait_for_next_step);
  auto twin_late = s.Accept(*twin, Header("a", 1), 10, 0, t0, &why);
  EXPECT_EQ(twin_late.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(why, Rejection::kDuplicate);
  // Sent round 1 again (a reply lost, the client polled): still one update.
  Send(s, o, "a");
  auto again = s.Admit(Header("a", 1), Handle(), 0, &why);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  // A push admitted for b's first task, then b takes a second one.
  Send(s, o, "b");
  auto b_old = s.Admit(Header("b", 1), Handle(), 0, &why);
  ASSERT_TRUE(b_old.ok());
  Send(s, o, "b");
  auto b_stale = s.Accept(*b_old, Header("b", 1), 10, 0, t0, &why);
  EXPECT_EQ(b_stale.status().code(), absl::StatusCode::kFailedPrecondition);
  auto b_new = s.Admit(Header("b", 1), Handle(), 0, &why);
  ASSERT_TRUE(b_new.ok());
  auto second = s.Accept(*b_new, Header("b", 1), 10, 0, t0, &why);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->accepted, 2);
  Send(s, o, "c");
  auto c = s.Admit(Header("c", 1), Handle(), 0, &why);
  ASSERT_TRUE(c.ok());
  auto third = s.Accept(*c, Header("c", 1), 10, 0, t0, &why);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->outcome, "async");
  EXPECT_FALSE(third->wait_for_next_step);
}

TEST(AsyncSchedulerTest, RejectsRepeatedForeignAndTooStaleUpdates) {
  AsyncScheduler::Options options = Buffered(1);
  options.max_staleness = 2;
  AsyncScheduler s(options);
  Opening o = s.Open({}, nullptr, nullptr, 0, t0);
  Rejection why;
  // No task sent: nothing to push for.
  auto untasked = s.Admit(Header("a", 1), Handle(), 0, &why);
  EXPECT_EQ(untasked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(why, Rejection::kStaleRound);
  Send(s, o, "a");
  auto wrong = s.Admit(Header("a", 4), Handle(), 0, &why);
  EXPECT_THAT(wrong.status().message(), HasSubstr("its task is for round 1"));
  auto ticket = s.Admit(Header("a", 1), Handle(), 0, &why);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(s.Accept(*ticket, Header("a", 1), 10, 0, t0, &why).ok());
  auto repeated = s.Admit(Header("a", 1), Handle(), 1, &why);
  EXPECT_EQ(repeated.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(why, Rejection::kDuplicate);
  // b's task is for round 1; three versions later it is 3 stale.
  Send(s, o, "b");
  auto too_stale = s.Admit(Header("b", 1), Handle(), 3, &why);
  EXPECT_THAT(too_stale.status().message(), HasSubstr("3 updates stale"));
  // Admitted 2 stale, it went 3 stale while uploading.
  auto admitted = s.Admit(Header("b", 1), Handle(), 2, &why);
  ASSERT_TRUE(admitted.ok());
  auto late = s.Accept(*admitted, Header("b", 1), 10, 3, t0, &why);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AsyncSchedulerTest, TrainingListsOutstandingTasksAndForgottenClientsGo) {
  AsyncScheduler s(Buffered(1));
  Opening o = s.Open({}, nullptr, nullptr, 0, t0);
  Send(s, o, "a");
  Send(s, o, "b");
  Send(s, o, "c");
  EXPECT_THAT(s.Training(), UnorderedElementsAre("a", "b", "c"));
  Rejection why;
  auto a = s.Admit(Header("a", 1), Handle(), 0, &why);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(s.Accept(*a, Header("a", 1), 10, 0, t0, &why).ok());
  EXPECT_THAT(s.Training(), UnorderedElementsAre("b", "c"));
  EXPECT_FALSE(s.IsTraining("a"));

  // b is forgotten while its push uploads: nothing of it is kept, the push
  // cannot be applied, and its id is a stranger's from then on.
  auto b = s.Admit(Header("b", 1), Handle(), 1, &why);
  ASSERT_TRUE(b.ok());
  s.Forget("b");
  EXPECT_THAT(s.Training(), UnorderedElementsAre("c"));
  EXPECT_FALSE(s.IsTraining("b"));
  auto late = s.Accept(*b, Header("b", 1), 10, 1, t0, &why);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(why, Rejection::kStaleRound);
  EXPECT_THAT(s.Training(), UnorderedElementsAre("c"));  // nothing recreated
  auto again = s.Admit(Header("b", 1), Handle(), 1, &why);
  EXPECT_THAT(again.status().message(), HasSubstr("its task is for round 0"));
  // a, forgotten after its update was in: what it pushed is forgotten too
  // (its id is a stranger's; a forgotten client's calls fail authorization
  // before they get here).
  s.Forget("a");
  auto stranger = s.Admit(Header("a", 1), Handle(), 1, &why);
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(why, Rejection::kStaleRound);
  s.Forget("never-seen");  // nothing to drop
  EXPECT_THAT(s.Training(), UnorderedElementsAre("c"));
}

TEST(AsyncSchedulerTest, StopCutsOffEveryPushInFlight) {
  AsyncScheduler s(Buffered(1));
  Opening o = s.Open({}, nullptr, nullptr, 0, t0);
  Send(s, o, "a");
  Rejection why;
  auto ticket = s.Admit(Header("a", 1), Handle(), 0, &why);
  ASSERT_TRUE(ticket.ok());
  EXPECT_TRUE(s.IsTraining("a"));
  auto cancelled = s.Stop();
  ASSERT_EQ(cancelled.size(), 1u);
  EXPECT_FALSE(s.is_open());
  EXPECT_FALSE(s.IsTraining("a"));
  EXPECT_FALSE(s.Accept(*ticket, Header("a", 1), 10, 0, t0, &why).ok());
}

TEST(AsyncSchedulerTest, DownloadsOfTheNewestVersionsRunOthersAreCutOff) {
  AsyncScheduler::Options options = Buffered(1);
  options.download_versions = 2;
  AsyncScheduler s(options);
  Opening o = s.Open({}, nullptr, nullptr, 0, t0);
  auto a = SendWithRetire(s, o, "a");  // round 1: version 0
  Closing c = s.Close("async", 0, 2, t0);
  EXPECT_TRUE(c.cancel.empty());  // rounds 1 and 2 are the newest two
  o = s.Open({}, nullptr, nullptr, 1, t0);
  auto b = SendWithRetire(s, o, "b");  // round 2: version 1
  c = s.Close("async", 1, 2, t0);
  ASSERT_EQ(c.cancel.size(), 1u);  // rounds 2 and 3 now
  EXPECT_EQ(c.cancel[0], a);
  o = s.Open({}, nullptr, nullptr, 2, t0);
  auto d = SendWithRetire(s, o, "d");  // round 3
  c = s.Close("async", 2, 2, t0);
  ASSERT_EQ(c.cancel.size(), 1u);
  EXPECT_EQ(c.cancel[0], b);
  // Training stops: every download left goes, with the pushes.
  auto stopped = s.Stop();
  ASSERT_EQ(stopped.size(), 1u);
  EXPECT_EQ(stopped[0], d);
}

TEST(AsyncSchedulerTest, ADownloadTooStaleToBeTakenIsCutOff) {
  AsyncScheduler::Options options = Buffered(1);
  options.max_staleness = 1;  // download_versions: no limit
  AsyncScheduler s(options);
  Opening o = s.Open({}, nullptr, nullptr, 0, t0);
  auto a = SendWithRetire(s, o, "a");  // round 1
  // At version 1 an update for round 1 is 1 stale: still taken.
  EXPECT_TRUE(s.Close("async", 0, 2, t0).cancel.empty());
  Rejection why;
  const std::shared_ptr<CancelHandle> push = Handle();
  EXPECT_TRUE(s.Admit(Header("a", 1), push, 1, &why).ok());
  o = s.Open({}, nullptr, nullptr, 1, t0);
  // A step that applied nothing leaves the version, the download and the
  // push as they were.
  EXPECT_TRUE(s.Close("abandoned", 1, 2, t0).cancel.empty());
  o = s.Open({}, nullptr, nullptr, 1, t0);
  // At version 2 it would be 2 stale and rejected: its download ends, and
  // so does the push still uploading it.
  Closing c = s.Close("async", 1, 2, t0);
  EXPECT_THAT(c.cancel, ::testing::UnorderedElementsAre(a, push));
  EXPECT_EQ(s.Admit(Header("a", 1), Handle(), 2, &why).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Without a bound, nothing is cut until training stops, and downloads that
// ended are let go of: a long run keeps no handle per download it served.
TEST(AsyncSchedulerTest, WithoutABoundEndedDownloadsAreLetGoOf) {
  AsyncScheduler s(Buffered(1));
  std::shared_ptr<CancelHandle> live;
  for (int64_t version = 0; version < 1000; ++version) {
    Opening o = s.Open({}, nullptr, nullptr, version, t0);
    auto handle = SendWithRetire(s, o, "c" + std::to_string(version % 10));
    if (version == 500) live = handle;  // one download still running
    EXPECT_TRUE(s.Close("async", version, 2, t0).cancel.empty());
  }
  const auto stopped = s.Stop();
  // InFlightCalls keeps at most twice the calls in flight plus 16.
  EXPECT_LE(stopped.size(), 18u);
  EXPECT_NE(std::find(stopped.begin(), stopped.end(), live), stopped.end());
}

}  // namespace
}  // namespace fedlearn
