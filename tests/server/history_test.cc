#include "server/history.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "fedlearn/v1/coordinator.pb.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

v1::RoundRecord Round(int64_t round) {
  v1::RoundRecord record;
  record.set_round(round);
  return record;
}

std::vector<int64_t> Rounds(const std::vector<History::Record>& records) {
  std::vector<int64_t> rounds;
  for (const History::Record& r : records) rounds.push_back(r->round());
  return rounds;
}

TEST(HistoryTest, RejectionsCountInTheRunAndInTheOpenAttempt) {
  History history;
  history.OpenAttempt();
  history.Reject(Rejection::kStaleRound);
  history.Reject(Rejection::kDuplicate);
  history.Reject(Rejection::kDuplicate);
  history.Reject(Rejection::kInvalid);
  history.Reject(Rejection::kTooSlow);
  EXPECT_EQ(history.attempt_rejections().stale_round(), 1);
  EXPECT_EQ(history.attempt_rejections().duplicate(), 2);
  EXPECT_EQ(history.attempt_rejections().invalid(), 1);
  EXPECT_EQ(history.attempt_rejections().too_slow(), 1);
  EXPECT_EQ(history.attempt_rejections().not_selected(), 0);

  // The next attempt starts from zero; the run's counts go on.
  history.OpenAttempt();
  history.Reject(Rejection::kNotSelected);
  history.Reject(Rejection::kTooLarge);
  history.Reject(Rejection::kIncomplete);
  EXPECT_EQ(history.attempt_rejections().duplicate(), 0);
  EXPECT_EQ(history.attempt_rejections().not_selected(), 1);
  EXPECT_EQ(history.attempt_rejections().too_large(), 1);
  EXPECT_EQ(history.attempt_rejections().incomplete(), 1);
  const v1::RejectionCounts& run = history.counters().updates_rejected;
  EXPECT_EQ(run.stale_round(), 1);
  EXPECT_EQ(run.duplicate(), 2);
  EXPECT_EQ(run.not_selected(), 1);
  EXPECT_EQ(run.invalid(), 1);
  EXPECT_EQ(run.too_large(), 1);
  EXPECT_EQ(run.incomplete(), 1);
  EXPECT_EQ(run.too_slow(), 1);
}

TEST(HistoryTest, LatestIsTheNewestOldestFirst) {
  History history;
  EXPECT_TRUE(history.Latest(5).empty());
  for (int64_t r = 1; r <= 6; ++r) history.Append(Round(r));
  EXPECT_EQ(history.size(), 6u);
  EXPECT_EQ(Rounds(history.Latest(3)), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(Rounds(history.Latest(6)),
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(Rounds(history.Latest(100)),
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(history.Latest(0).empty());
}

// A status or a save takes the record pointers under the lock and reads them
// after releasing it: what it took must not change while the run goes on.
TEST(HistoryTest, TakenRecordsOutliveLaterAppendsAndRestores) {
  History history;
  history.Append(Round(1));
  history.Append(Round(2));
  const std::vector<History::Record> taken = history.Latest(2);
  const v1::RoundRecord* first = taken[0].get();
  for (int64_t r = 3; r <= 1000; ++r) history.Append(Round(r));
  history.Restore({Round(7)}, 0, 0);
  EXPECT_EQ(taken[0].get(), first);
  EXPECT_EQ(Rounds(taken), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Rounds(history.Latest(10)), (std::vector<int64_t>{7}));
}

TEST(HistoryTest, RestoreTakesRecordsAndBytesButCountersStartAtZero) {
  History history;
  history.Append(Round(1));
  history.AddBytesSent(10);
  history.Reject(Rejection::kInvalid);
  history.Restore({Round(3), Round(4)}, /*bytes_sent=*/1000,
                  /*bytes_received=*/2000);
  EXPECT_EQ(Rounds(history.Latest(10)), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(history.bytes_sent(), 1000);
  EXPECT_EQ(history.bytes_received(), 2000);
  // Counters are this process's: Restore leaves them to the process.
  EXPECT_EQ(history.counters().updates_rejected.invalid(), 1);

  History resumed;
  resumed.Restore({Round(3)}, 5, 6);
  EXPECT_EQ(resumed.counters().updates_rejected.invalid(), 0);
  EXPECT_EQ(resumed.counters().rounds_completed, 0);
  resumed.AddBytesSent(1);
  resumed.AddBytesReceived(2);
  EXPECT_EQ(resumed.bytes_sent(), 6);
  EXPECT_EQ(resumed.bytes_received(), 8);
}

}  // namespace
}  // namespace fedlearn
