#include "server/history.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

v1::RoundRecord Round(int64_t round) {
  v1::RoundRecord record;
  record.set_round(round);
  return record;
}

v1::RoundRecord Copy(const History::Record& record, bool client_ids = true) {
  v1::RoundRecord copy;
  record.CopyTo(&copy, client_ids);
  return copy;
}

std::vector<int64_t> Rounds(const std::vector<History::Record>& records) {
  std::vector<int64_t> rounds;
  for (const History::Record& r : records) rounds.push_back(Copy(r).round());
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
  EXPECT_EQ(history.total(), 6u);
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
  const std::string first = Copy(taken[0]).SerializeAsString();
  for (int64_t r = 3; r <= 1000; ++r) history.Append(Round(r));
  history.Restore({Round(7)}, 0, 0);
  EXPECT_EQ(Copy(taken[0]).SerializeAsString(), first);
  EXPECT_EQ(Rounds(taken), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Rounds(history.Latest(10)), (std::vector<int64_t>{7}));
}

// Records are packed into shared blocks, and a large one (a round of thousands
// of clients) gets a block of its own: every record reads back as appended,
// with or without its ids, and a handle keeps its record readable after the
// history is gone.
TEST(HistoryTest, RecordsOfEverySizeReadBackAsAppendedAndOutliveTheHistory) {
  std::vector<v1::RoundRecord> appended;
  std::vector<History::Record> taken;
  {
    History history;
    for (int64_t r = 1; r <= 600; ++r) {
      v1::RoundRecord record = Round(r);
      record.set_outcome("quorum");
      record.set_duration_seconds(1.0 / static_cast<double>(r));
      // Rounds 100 and 400 select 5,000 clients: about 90 KB of ids.
      const int clients = r % 300 == 100 ? 5000 : static_cast<int>(r % 20);
      for (int c = 0; c < clients; ++c) {
        record.add_selected_clients(absl::StrCat("client-", c));
        if (c % 2 == 0) record.add_accepted_clients(absl::StrCat("client-", c));
      }
      history.Append(record);
      appended.push_back(std::move(record));
    }
    taken = history.Latest(1000);
  }
  ASSERT_EQ(taken.size(), appended.size());
  for (size_t i = 0; i < taken.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("round ", i + 1));
    EXPECT_EQ(Copy(taken[i]).SerializeAsString(),
              appended[i].SerializeAsString());
    const v1::RoundRecord summary = Copy(taken[i], /*client_ids=*/false);
    EXPECT_EQ(summary.round(), appended[i].round());
    EXPECT_EQ(summary.duration_seconds(), appended[i].duration_seconds());
    EXPECT_EQ(summary.selected_clients_size(), 0);
    EXPECT_EQ(summary.accepted_clients_size(), 0);
  }
}

// A status copies a record's client ids only when asked (a round of 1,000
// clients carries about 25 KB of them); a save always does.
TEST(HistoryTest, ARecordIsCopiedWithItsClientIdsOnlyWhenAsked) {
  v1::RoundRecord record = Round(3);
  record.set_selected(3);
  record.set_responded(2);
  record.set_outcome("quorum");
  for (const char* id : {"c-1", "c-2", "c-3"}) record.add_selected_clients(id);
  for (const char* id : {"c-3", "c-1"}) record.add_accepted_clients(id);
  History history;
  history.Append(record);
  const std::vector<History::Record> latest = history.Latest(1);
  ASSERT_EQ(latest.size(), 1u);
  const History::Record& kept = latest[0];

  const v1::RoundRecord with_ids = Copy(kept, /*client_ids=*/true);
  EXPECT_EQ(with_ids.SerializeAsString(), record.SerializeAsString());

  const v1::RoundRecord without = Copy(kept, /*client_ids=*/false);
  EXPECT_EQ(without.selected_clients_size(), 0);
  EXPECT_EQ(without.accepted_clients_size(), 0);
  v1::RoundRecord expected = record;
  expected.clear_selected_clients();
  expected.clear_accepted_clients();
  EXPECT_EQ(without.SerializeAsString(), expected.SerializeAsString());
  // Into a message that held something: replaced, not merged.
  v1::RoundRecord reused = with_ids;
  kept.CopyTo(&reused, /*client_ids=*/true);
  EXPECT_EQ(reused.SerializeAsString(), record.SerializeAsString());
}

// The client ids are kept for the newest records only, as many as the budget
// holds (twice that between trimmings): older records keep their summary, so
// memory stops growing with the clients of every round ever run. A handle
// taken before a trim still reads its record whole.
TEST(HistoryTest, OnlyTheNewestRecordsKeepTheirClientIds) {
  // 100 ids of 10 bytes (12 on the wire) a record: 1,200 bytes of ids.
  auto round = [](int64_t r) {
    v1::RoundRecord record = Round(r);
    record.set_outcome("all");
    for (int c = 0; c < 100; ++c) {
      record.add_selected_clients(absl::StrCat("client-", 100 + c));
    }
    return record;
  };
  v1::RoundRecord bare = round(1);
  bare.clear_selected_clients();
  const size_t per_record = round(1).ByteSizeLong() - bare.ByteSizeLong();
  History history(/*id_bytes=*/10 * per_record);
  history.Append(round(1));
  const History::Record first = history.Latest(1)[0];
  for (int64_t r = 2; r <= 1000; ++r) {
    history.Append(round(r));
    EXPECT_LE(history.id_bytes(), 20 * per_record) << r;
  }
  const std::vector<History::Record> all = history.Latest(1000);
  ASSERT_EQ(all.size(), 1000u);
  int with_ids = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const v1::RoundRecord copy = Copy(all[i]);
    EXPECT_EQ(copy.round(), static_cast<int64_t>(i + 1));
    EXPECT_EQ(copy.outcome(), "all");
    if (copy.selected_clients_size() == 0) {
      EXPECT_EQ(with_ids, 0) << "an older record kept its ids, round " << i;
    } else {
      EXPECT_EQ(copy.selected_clients_size(), 100);
      ++with_ids;
    }
  }
  EXPECT_GE(with_ids, 10);
  EXPECT_LE(with_ids, 20);
  EXPECT_EQ(Copy(all.back()).selected_clients(99), "client-199");
  // Taken before the trims: still whole.
  EXPECT_EQ(Copy(first).selected_clients_size(), 100);
}

// At most max_records are kept, the newest; older ones are let go of and
// counted, but only those before the mark (what a save wrote): none is let go
// of before the history file has it.
TEST(HistoryTest, KeepsTheNewestRecordsAndLetsGoOfSavedOnesOnly) {
  History history(History::kDefaultIdBytes, /*max_records=*/3);
  for (int64_t r = 1; r <= 5; ++r) history.Append(Round(r));
  EXPECT_EQ(history.total(), 5u);
  EXPECT_EQ(history.kept(), 3u);
  EXPECT_EQ(Rounds(history.Latest(10)), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(Rounds(history.From(0)), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(Rounds(history.From(4)), (std::vector<int64_t>{5}));
  EXPECT_TRUE(history.From(5).empty());

  // Nothing before record 6 (round 7) saved: rounds 6 to 9 stay.
  history.AllowEvictionBefore(5);
  for (int64_t r = 6; r <= 9; ++r) history.Append(Round(r));
  EXPECT_EQ(history.total(), 9u);
  EXPECT_EQ(Rounds(history.Latest(10)), (std::vector<int64_t>{6, 7, 8, 9}));
  // Saved up to round 8: back to three.
  history.AllowEvictionBefore(8);
  EXPECT_EQ(Rounds(history.Latest(10)), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(history.total(), 9u);
}

// Records let go of take their client ids' bytes with them: the ids' budget
// counts what is kept.
TEST(HistoryTest, RecordsLetGoOfReturnTheirIdBytes) {
  History history(History::kDefaultIdBytes, /*max_records=*/2);
  v1::RoundRecord record = Round(1);
  record.add_selected_clients("client-1");
  const size_t ids = record.ByteSizeLong() - Round(1).ByteSizeLong();
  for (int64_t r = 1; r <= 4; ++r) {
    record.set_round(r);
    history.Append(record);
  }
  EXPECT_EQ(history.id_bytes(), 2 * ids);
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
