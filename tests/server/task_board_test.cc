#include "server/task_board.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

const absl::Time t0 = absl::FromUnixSeconds(1'000'000);

Task Make(v1::TaskType type, int64_t round) {
  Task task;
  task.type = type;
  task.round = round;
  return task;
}

// Where a poll's answer lands.
struct Answer {
  std::optional<absl::StatusOr<Task>> got;
  PollCallback Callback() {
    return [this](absl::StatusOr<Task> task) { got = std::move(task); };
  }
};

void RunAll(TaskBoard::Deliveries deliveries) {
  for (auto& d : deliveries) d.Run();
}

TEST(TaskBoardTest, AWaitPollIsHeldAndAnsweredWhenATaskIsPosted) {
  TaskBoard board;
  Answer a;
  TaskBoard::PollResult poll =
      board.Poll("a", t0 + absl::Seconds(30), a.Callback());
  EXPECT_FALSE(poll.now.has_value());
  EXPECT_EQ(board.held(), 1u);
  // A task for another client leaves it waiting.
  EXPECT_TRUE(board.Post("b", Make(v1::TASK_TYPE_TRAIN, 1)).empty());
  TaskBoard::Deliveries d = board.Post("a", Make(v1::TASK_TYPE_TRAIN, 1));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].client_id, "a");
  EXPECT_EQ(d[0].poll_id, poll.poll_id);
  EXPECT_FALSE(a.got.has_value());  // nothing runs until the caller says so
  RunAll(std::move(d));
  ASSERT_TRUE(a.got.has_value() && a.got->ok());
  EXPECT_EQ((*a.got)->type, v1::TASK_TYPE_TRAIN);
  EXPECT_EQ(board.held(), 0u);
}

// A client opening polls in a loop holds two at most: each further one
// displaces its oldest, answered WAIT at once; another client's are untouched.
TEST(TaskBoardTest, AClientHoldsTwoPollsAtMostTheOldestGivesWay) {
  TaskBoard board;
  std::vector<Answer> a(4);
  Answer b;
  board.Poll("b", t0 + absl::Seconds(30), b.Callback());
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    TaskBoard::PollResult poll =
        board.Poll("a", t0 + absl::Seconds(30), a[i].Callback());
    EXPECT_FALSE(poll.now.has_value());
    ids.push_back(poll.poll_id);
    if (i < 2) {
      EXPECT_FALSE(poll.displaced.has_value()) << i;
      continue;
    }
    ASSERT_TRUE(poll.displaced.has_value()) << i;
    EXPECT_EQ(poll.displaced->poll_id, ids[i - 2]);
    poll.displaced->Run();
    ASSERT_TRUE(a[i - 2].got.has_value() && a[i - 2].got->ok());
    EXPECT_EQ((*a[i - 2].got)->type, v1::TASK_TYPE_WAIT);
  }
  EXPECT_EQ(board.held(), 3u);  // a's two newest and b's
  EXPECT_FALSE(b.got.has_value());
  RunAll(board.Post("a", Make(v1::TASK_TYPE_TRAIN, 1)));
  EXPECT_EQ((*a[2].got)->type, v1::TASK_TYPE_TRAIN);
  EXPECT_EQ((*a[3].got)->type, v1::TASK_TYPE_TRAIN);
  EXPECT_EQ(board.held(), 1u);
}

TEST(TaskBoardTest, APostedTaskIsGivenAgainUntilRetracted) {
  TaskBoard board;
  board.Post("a", Make(v1::TASK_TYPE_TRAIN, 3));
  for (int i = 0; i < 2; ++i) {
    Answer a;
    TaskBoard::PollResult poll = board.Poll("a", t0, a.Callback());
    ASSERT_TRUE(poll.now.has_value());
    EXPECT_EQ(poll.now->task->round, 3);
  }
  board.Retract("a");
  Answer a;
  EXPECT_FALSE(board.Poll("a", t0 + absl::Seconds(1), a.Callback()).now);
}

TEST(TaskBoardTest, TheDefaultAnswersEveryoneWithoutAPostedTask) {
  TaskBoard board;
  Answer a, b;
  board.Poll("a", t0 + absl::Seconds(30), a.Callback());
  board.Poll("b", t0 + absl::Seconds(30), b.Callback());
  board.Post("a", Make(v1::TASK_TYPE_WAIT, 2));  // a is told to wait
  TaskBoard::Deliveries d = board.SetDefault(Make(v1::TASK_TYPE_DONE, 2));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].client_id, "b");
  EXPECT_EQ(board.held(), 1u);
  // A WAIT default answers nobody.
  EXPECT_TRUE(board.SetDefault(Make(v1::TASK_TYPE_WAIT, 3)).empty());
}

TEST(TaskBoardTest, PollsExpireInDeadlineOrderWithTheirWaitTask) {
  TaskBoard board;
  board.SetDefault(Make(v1::TASK_TYPE_WAIT, 4));
  Answer late, early;
  board.Poll("late", t0 + absl::Seconds(30), late.Callback());
  board.Poll("early", t0 + absl::Seconds(10), early.Callback());
  EXPECT_EQ(board.NextExpiry(), t0 + absl::Seconds(10));
  EXPECT_TRUE(board.Expire(t0 + absl::Seconds(9)).empty());
  TaskBoard::Deliveries d = board.Expire(t0 + absl::Seconds(10));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].client_id, "early");
  EXPECT_EQ(d[0].task->type, v1::TASK_TYPE_WAIT);
  EXPECT_EQ(d[0].task->round, 4);
  EXPECT_EQ(board.NextExpiry(), t0 + absl::Seconds(30));
  EXPECT_EQ(board.Expire(t0 + absl::Hours(1)).size(), 1u);
  EXPECT_EQ(board.NextExpiry(), absl::InfiniteFuture());
}

TEST(TaskBoardTest, CancelAndCloseAllEndHeldPollsWithTheirStatus) {
  TaskBoard board;
  Answer a, b;
  const uint64_t id =
      board.Poll("a", t0 + absl::Seconds(30), a.Callback()).poll_id;
  board.Poll("b", t0 + absl::Seconds(30), b.Callback());
  std::optional<TaskBoard::Delivery> cancelled = board.Cancel(id);
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ(cancelled->task.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(cancelled->task.status().message(), "client a: poll cancelled");
  EXPECT_FALSE(board.Cancel(id).has_value());  // only once
  TaskBoard::Deliveries d =
      board.CloseAll(absl::UnavailableError("shutting down"));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].task.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(d[0].task.status().message(), "client b: shutting down");
  EXPECT_EQ(board.held(), 0u);
  EXPECT_EQ(board.NextExpiry(), absl::InfiniteFuture());
}

TEST(TaskBoardTest, TwoPollsOfOneClientAreBothAnswered) {
  TaskBoard board;
  Answer first, second;
  board.Poll("a", t0 + absl::Seconds(5), first.Callback());
  board.Poll("a", t0 + absl::Seconds(6), second.Callback());
  EXPECT_EQ(board.Post("a", Make(v1::TASK_TYPE_EVALUATE, 9)).size(), 2u);
  EXPECT_EQ(board.NextExpiry(), absl::InfiniteFuture());
}

TEST(TaskBoardTest, ManyHeldPollsStayOrderedByExpiry) {
  TaskBoard board;
  std::vector<Answer> answers(1000);
  for (int i = 0; i < 1000; ++i) {
    // Expiries out of order: 0, 7, 14, ... mod 1000 seconds.
    board.Poll("c" + std::to_string(i), t0 + absl::Seconds((i * 7) % 1000),
               answers[i].Callback());
  }
  EXPECT_EQ(board.held(), 1000u);
  EXPECT_EQ(board.Expire(t0 + absl::Seconds(499)).size(), 500u);
  EXPECT_EQ(board.NextExpiry(), t0 + absl::Seconds(500));
}

}  // namespace
}  // namespace fedlearn
