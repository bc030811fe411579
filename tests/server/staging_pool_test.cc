#include "server/staging_pool.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time t0 = absl::FromUnixSeconds(1'000'000);

// Records the buffer each lease received (at once or through its callback),
// in the order they came, and the preemptions. Single-threaded tests only.
struct Recorder {
  struct Call {
    int waiter;
    StagingPool::Buffer buffer;
  };
  std::vector<Call> calls;
  std::vector<uint64_t> ids;  // by waiter
  std::vector<std::pair<int, std::string>> preempted;

  // Waiter `waiter` asks `pool` for a buffer at `now`; returns its lease id.
  uint64_t Acquire(StagingPool& pool, int waiter, absl::Time now = t0) {
    StagingPool::Lease lease = pool.Acquire(
        For(waiter),
        [this, waiter](const std::string& reason) {
          preempted.emplace_back(waiter, reason);
        },
        now);
    if (lease.buffer != nullptr)
      calls.push_back({waiter, std::move(lease.buffer)});
    if (ids.size() <= static_cast<size_t>(waiter)) ids.resize(waiter + 1);
    ids[waiter] = lease.id;
    return lease.id;
  }

  // Gives back the buffer `waiter` holds.
  void Release(StagingPool& pool, int waiter, absl::Time now = t0) {
    pool.Release(ids[waiter], Take(waiter), now);
  }

  StagingPool::Callback For(int waiter) {
    return [this, waiter](StagingPool::Buffer buffer) {
      calls.push_back({waiter, std::move(buffer)});
    };
  }

  std::vector<int> Order() const {
    std::vector<int> order;
    for (const Call& c : calls) order.push_back(c.waiter);
    return order;
  }

  // Takes the buffer handed to `waiter` (which must have been served once).
  StagingPool::Buffer Take(int waiter) {
    for (Call& c : calls) {
      if (c.waiter == waiter) return std::move(c.buffer);
    }
    ADD_FAILURE() << "waiter " << waiter << " was never called";
    return nullptr;
  }
};

TEST(StagingPoolTest, HandsOutBuffersOfTheRightSizeImmediately) {
  StagingPool pool(3, 1000);
  EXPECT_EQ(pool.in_use(), 0);
  Recorder rec;
  for (int i = 0; i < 3; ++i) {
    rec.Acquire(pool, i);
    // Served before Acquire returns.
    ASSERT_EQ(rec.calls.size(), static_cast<size_t>(i + 1));
    ASSERT_NE(rec.calls[i].buffer, nullptr);
    EXPECT_EQ(rec.calls[i].buffer->size(), 1000u);
    // On a cache line, so that no vector load of the update spans two.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(rec.calls[i].buffer->data()) %
                  kCacheLineBytes,
              0u);
    EXPECT_EQ(pool.in_use(), i + 1);
  }
  // Three distinct buffers.
  EXPECT_NE(rec.calls[0].buffer.get(), rec.calls[1].buffer.get());
  EXPECT_NE(rec.calls[1].buffer.get(), rec.calls[2].buffer.get());
  EXPECT_NE(rec.calls[0].buffer.get(), rec.calls[2].buffer.get());
}

TEST(StagingPoolTest, AcquireBeyondTheLimitWaitsForARelease) {
  StagingPool pool(2, 16);
  Recorder rec;
  rec.Acquire(pool, 0);
  rec.Acquire(pool, 1);
  rec.Acquire(pool, 2);
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1));
  EXPECT_EQ(pool.in_use(), 2);

  const AlignedVector<float>* const released = rec.calls[0].buffer.get();
  rec.Release(pool, 0);
  // The waiter receives the very buffer that was released; it stays in use.
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1, 2));
  EXPECT_EQ(rec.calls[2].buffer.get(), released);
  EXPECT_EQ(pool.in_use(), 2);
}

TEST(StagingPoolTest, WaitersAreServedFirstComeFirstServed) {
  StagingPool pool(1, 4);
  Recorder rec;
  for (int i = 0; i < 5; ++i) rec.Acquire(pool, i);
  EXPECT_THAT(rec.Order(), ElementsAre(0));
  for (int i = 0; i < 4; ++i) rec.Release(pool, i);
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ(pool.in_use(), 1);
  rec.Release(pool, 4);
  EXPECT_EQ(pool.in_use(), 0);
}

TEST(StagingPoolTest, ReleasedBuffersAreReused) {
  StagingPool pool(1, 8);
  Recorder rec;
  rec.Acquire(pool, 0);
  (*rec.calls[0].buffer)[0] = 42.0f;
  const AlignedVector<float>* const address = rec.calls[0].buffer.get();
  rec.Release(pool, 0);
  EXPECT_EQ(pool.in_use(), 0);

  rec.Acquire(pool, 1);
  ASSERT_EQ(rec.calls.size(), 2u);
  EXPECT_EQ(rec.calls[1].buffer.get(), address);
  EXPECT_EQ(rec.calls[1].buffer->size(), 8u);
  EXPECT_EQ(pool.in_use(), 1);
}

TEST(StagingPoolTest, InUseCountsBuffersHandedOut) {
  StagingPool pool(3, 2);
  Recorder rec;
  rec.Acquire(pool, 0);
  rec.Acquire(pool, 1);
  EXPECT_EQ(pool.in_use(), 2);
  rec.Release(pool, 1);
  EXPECT_EQ(pool.in_use(), 1);
  rec.Release(pool, 0);
  EXPECT_EQ(pool.in_use(), 0);
  for (int i = 2; i < 6; ++i) rec.Acquire(pool, i);  // 3 served, 1 waits
  EXPECT_EQ(pool.in_use(), 3);
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1, 2, 3, 4));
}

TEST(StagingPoolTest, IdsAreDistinct) {
  StagingPool pool(1, 1);
  Recorder rec;
  const uint64_t a = rec.Acquire(pool, 0);  // served
  const uint64_t b = rec.Acquire(pool, 1);  // queued
  const uint64_t c = rec.Acquire(pool, 2);  // queued
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  EXPECT_NE(a, c);
}

TEST(StagingPoolTest, CancelOfAQueuedWaiterCallsItWithNullptrOnce) {
  StagingPool pool(1, 4);
  Recorder rec;
  rec.Acquire(pool, 0);
  const uint64_t id1 = rec.Acquire(pool, 1);
  rec.Acquire(pool, 2);

  pool.Cancel(id1);
  ASSERT_THAT(rec.Order(), ElementsAre(0, 1));
  EXPECT_EQ(rec.calls[1].buffer, nullptr);
  EXPECT_EQ(pool.in_use(), 1);

  // A second Cancel of the same id does nothing.
  pool.Cancel(id1);
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1));

  // The cancelled waiter is out of the queue: the next buffer goes to waiter 2.
  rec.Release(pool, 0);
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1, 2));
  EXPECT_NE(rec.calls[2].buffer, nullptr);
  EXPECT_EQ(pool.in_use(), 1);
}

// A quorum's close cancels many waiting pushes at once, in any order: each
// leaves the queue (waiting() counts only the live ones), and buffers go on
// to the remaining waiters first come, first served.
TEST(StagingPoolTest, CancelsAnywhereInTheQueueKeepItsOrder) {
  StagingPool pool(1, 4);
  Recorder rec;
  rec.Acquire(pool, 0);
  for (int w = 1; w <= 7; ++w) rec.Acquire(pool, w);
  EXPECT_EQ(pool.waiting(), 7);
  for (int w : {4, 2, 7, 1}) pool.Cancel(rec.ids[w]);  // middle, ends
  EXPECT_EQ(pool.waiting(), 3);
  for (int w : {4, 2, 7, 1}) pool.Cancel(rec.ids[w]);  // again: nothing
  EXPECT_EQ(pool.waiting(), 3);
  ASSERT_THAT(rec.Order(), ElementsAre(0, 4, 2, 7, 1));
  for (size_t i = 1; i < rec.calls.size(); ++i) {
    EXPECT_EQ(rec.calls[i].buffer, nullptr);
  }
  rec.Release(pool, 0);
  rec.Release(pool, 3);
  rec.Release(pool, 5);
  EXPECT_THAT(rec.Order(), ElementsAre(0, 4, 2, 7, 1, 3, 5, 6));
  EXPECT_NE(rec.calls.back().buffer, nullptr);
  EXPECT_EQ(pool.waiting(), 0);
  EXPECT_EQ(pool.in_use(), 1);
  rec.Acquire(pool, 8);  // queued behind waiter 6 again
  EXPECT_EQ(pool.waiting(), 1);
}

TEST(StagingPoolTest, CancelOfAServedIdDoesNothing) {
  StagingPool pool(1, 4);
  Recorder rec;
  const uint64_t id0 = rec.Acquire(pool, 0);
  const uint64_t id1 = rec.Acquire(pool, 1);
  pool.Cancel(id0);  // served at once
  EXPECT_THAT(rec.Order(), ElementsAre(0));
  EXPECT_NE(rec.calls[0].buffer, nullptr);
  EXPECT_EQ(pool.in_use(), 1);

  rec.Release(pool, 0);  // serves waiter 1
  pool.Cancel(id1);      // served from the queue
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1));
  EXPECT_NE(rec.calls[1].buffer, nullptr);
  EXPECT_EQ(pool.in_use(), 1);

  pool.Cancel(12345);  // never issued
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1));
}

TEST(StagingPoolTest, CallbacksRunOutsideTheLock) {
  // A callback may call back into the pool: here each served waiter releases
  // its buffer at once, which hands it on to the next waiter from inside the
  // callback.
  StagingPool pool(1, 4);
  std::vector<int> order;
  StagingPool::Lease held = pool.Acquire(nullptr, nullptr, t0);
  ASSERT_NE(held.buffer, nullptr);
  std::vector<uint64_t> ids(4);
  for (int i = 1; i <= 3; ++i) {
    ids[i] = pool.Acquire(
                     [&pool, &order, &ids, i](StagingPool::Buffer b) {
                       order.push_back(i);
                       EXPECT_EQ(pool.in_use(), 1);
                       pool.Release(ids[i], std::move(b), t0);
                     },
                     nullptr, t0)
                 .id;
  }
  EXPECT_TRUE(order.empty());
  pool.Release(held.id, std::move(held.buffer), t0);
  EXPECT_THAT(order, ElementsAre(1, 2, 3));
  EXPECT_EQ(pool.in_use(), 0);
}

TEST(StagingPoolTest, ConcurrentAcquireAndReleaseNeverExceedTheLimit) {
  constexpr int kBuffers = 2;
  constexpr int kThreads = 4;
  constexpr int kRounds = 500;
  StagingPool pool(kBuffers, 32);
  std::atomic<int> holding{0};
  std::atomic<int> max_holding{0};
  std::atomic<int> served{0};

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        absl::Notification got;
        StagingPool::Buffer buffer;
        StagingPool::Lease lease = pool.Acquire(
            [&](StagingPool::Buffer b) {
              buffer = std::move(b);
              got.Notify();
            },
            nullptr, absl::Now());
        if (lease.buffer != nullptr) {
          buffer = std::move(lease.buffer);
        } else {
          got.WaitForNotification();
        }
        if (buffer == nullptr) {
          ADD_FAILURE() << "thread " << t << " got no buffer";
          continue;
        }
        EXPECT_EQ(buffer->size(), 32u);
        const int now = holding.fetch_add(1) + 1;
        int seen = max_holding.load();
        while (now > seen && !max_holding.compare_exchange_weak(seen, now)) {
        }
        (*buffer)[r % 32] = static_cast<float>(t);
        holding.fetch_sub(1);
        served.fetch_add(1);
        pool.Release(lease.id, std::move(buffer), absl::Now());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(served.load(), kThreads * kRounds);
  EXPECT_LE(max_holding.load(), kBuffers);
  EXPECT_EQ(pool.in_use(), 0);
}

// Reclaim: what a slow or stalled upload can no longer do to the others. The
// policy here: stalled after 10 s without a byte; below 1000 bytes/s over at
// least 1 s while others wait.
StagingPolicy TestPolicy() {
  StagingPolicy policy;
  policy.idle_timeout = absl::Seconds(10);
  policy.min_rate = 1000;
  policy.grace = absl::Seconds(1);
  return policy;
}

TEST(StagingPoolReclaimTest, AStalledUploadIsReclaimedWhetherOrNotOthersWait) {
  StagingPool pool(2, 4, TestPolicy());
  Recorder rec;
  rec.Acquire(pool, 0);
  rec.Acquire(pool, 1);
  pool.Progress(rec.ids[1], 100, t0 + absl::Seconds(5));
  EXPECT_TRUE(pool.Reclaim(t0 + absl::Seconds(9)).empty());
  // Waiter 0 sent nothing for 10 s; waiter 1 last sent at 5 s.
  std::vector<StagingPool::Reclaimed> reclaimed =
      pool.Reclaim(t0 + absl::Seconds(10));
  ASSERT_EQ(reclaimed.size(), 1u);
  EXPECT_EQ(reclaimed[0].id, rec.ids[0]);
  reclaimed[0].Run();
  ASSERT_EQ(rec.preempted.size(), 1u);
  EXPECT_EQ(rec.preempted[0].first, 0);
  EXPECT_THAT(rec.preempted[0].second,
              HasSubstr("upload stalled: nothing received for 10s"));
  // Once only: the holder gives the buffer back when its call has ended.
  EXPECT_TRUE(pool.Reclaim(t0 + absl::Seconds(11)).empty());
  EXPECT_EQ(pool.in_use(), 2);
  rec.Release(pool, 0);
  EXPECT_EQ(pool.in_use(), 1);
}

TEST(StagingPoolReclaimTest, ATrickleKeepsItsBufferWhileNobodyWaits) {
  StagingPool pool(1, 4, TestPolicy());
  Recorder rec;
  rec.Acquire(pool, 0);
  for (int s = 1; s <= 30; ++s) {
    pool.Progress(rec.ids[0], 10, t0 + absl::Seconds(s));  // 10 bytes/s
    EXPECT_TRUE(pool.Reclaim(t0 + absl::Seconds(s)).empty()) << s;
  }
}

TEST(StagingPoolReclaimTest, WhileOthersWaitTheSlowestBelowTheRateGiveWay) {
  StagingPool pool(3, 4, TestPolicy());
  Recorder rec;
  rec.Acquire(pool, 0);
  rec.Acquire(pool, 1);
  rec.Acquire(pool, 2);
  rec.Acquire(pool, 3, t0 + absl::Seconds(1));  // waits
  rec.Acquire(pool, 4, t0 + absl::Seconds(1));  // waits
  // Over 2 s: waiter 0 at 5000 bytes/s, 1 at 50, 2 at 500.
  const absl::Time now = t0 + absl::Seconds(2);
  pool.Progress(rec.ids[0], 10000, now);
  pool.Progress(rec.ids[1], 100, now);
  pool.Progress(rec.ids[2], 1000, now);
  // Within its first second a lease is not judged.
  EXPECT_TRUE(pool.Reclaim(t0 + absl::Milliseconds(900)).empty());
  std::vector<StagingPool::Reclaimed> reclaimed = pool.Reclaim(now);
  ASSERT_EQ(reclaimed.size(), 2u);  // one per waiter, slowest first
  EXPECT_EQ(reclaimed[0].id, rec.ids[1]);
  EXPECT_EQ(reclaimed[1].id, rec.ids[2]);
  for (const auto& r : reclaimed) r.Run();
  EXPECT_THAT(rec.preempted[0].second,
              HasSubstr("upload too slow: 50 bytes/s over 2s"));
  EXPECT_THAT(rec.preempted[0].second, HasSubstr("2 other upload(s) waited"));
  // Their buffers go to the waiters, in order, as the holders give them back.
  rec.Release(pool, 1, now);
  rec.Release(pool, 2, now);
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1, 2, 3, 4));
  // The new holders are judged from their own grant.
  EXPECT_TRUE(pool.Reclaim(now + absl::Milliseconds(999)).empty());
}

TEST(StagingPoolReclaimTest, AStalledUploadCountsTowardsTheWaiters) {
  StagingPool pool(2, 4, TestPolicy());
  Recorder rec;
  rec.Acquire(pool, 0);
  rec.Acquire(pool, 1);
  rec.Acquire(pool, 2, t0 + absl::Seconds(10));             // waits
  pool.Progress(rec.ids[1], 5000, t0 + absl::Seconds(10));  // 500 bytes/s
  // Waiter 0 stalled; that frees a buffer for the one waiter, so the slow but
  // moving waiter 1 keeps its own.
  std::vector<StagingPool::Reclaimed> reclaimed =
      pool.Reclaim(t0 + absl::Seconds(10));
  ASSERT_EQ(reclaimed.size(), 1u);
  EXPECT_EQ(reclaimed[0].id, rec.ids[0]);
}

// Finishes `n` uploads one after another through `pool` (one buffer free),
// each of `bytes` bytes over `seconds`, as waiters first..first+n-1 of `rec`;
// returns the time the last one finished.
absl::Time FinishUploads(StagingPool& pool, Recorder& rec, int first, int n,
                         int64_t bytes, absl::Duration seconds,
                         absl::Time start) {
  absl::Time now = start;
  for (int i = first; i < first + n; ++i) {
    rec.Acquire(pool, i, now);
    now += seconds;
    pool.Progress(rec.ids[i], bytes, now);
    rec.Release(pool, i, now);
  }
  return now;
}

TEST(StagingPoolReclaimTest, WhenEveryUploadIsSlowNoneIsPreemptedForIt) {
  // A coordinator short of CPU: the last uploads finished at 400 bytes/s, so
  // an upload at 300 bytes/s (below --min_upload_rate=1000) is as fast as its
  // peers and keeps its buffer although others wait.
  StagingPool pool(1, 4, TestPolicy());
  Recorder rec;
  absl::Time now = FinishUploads(pool, rec, 0, 5, 4000, absl::Seconds(10), t0);
  rec.Acquire(pool, 5, now);
  rec.Acquire(pool, 6, now);  // waits
  pool.Progress(rec.ids[5], 600, now + absl::Seconds(2));
  EXPECT_TRUE(pool.Reclaim(now + absl::Seconds(2)).empty());
  // A trickle far below its peers still gives way: under 1/8 of their 400
  // bytes/s, 50.
  for (int s = 9; s <= 36; s += 9) {
    pool.Progress(rec.ids[5], 10, now + absl::Seconds(s));
  }
  EXPECT_TRUE(pool.Reclaim(now + absl::Seconds(10)).empty());  // 61 bytes/s
  std::vector<StagingPool::Reclaimed> reclaimed =
      pool.Reclaim(now + absl::Seconds(40));  // 640 bytes over 40 s: 16/s
  ASSERT_EQ(reclaimed.size(), 1u);
  EXPECT_EQ(reclaimed[0].id, rec.ids[5]);
  reclaimed[0].Run();
  EXPECT_THAT(rec.preempted[0].second,
              HasSubstr("upload too slow: 16 bytes/s over 40s, below 50 "
                        "bytes/s (1/8 of the median rate of the last 5 "
                        "uploads; --min_upload_rate=1000)"));
}

TEST(StagingPoolReclaimTest, FastPeersNeverRaiseTheBarAboveTheMinimumRate) {
  StagingPool pool(1, 4, TestPolicy());
  Recorder rec;
  absl::Time now =
      FinishUploads(pool, rec, 0, 3, 1'000'000, absl::Seconds(1), t0);
  rec.Acquire(pool, 3, now);
  rec.Acquire(pool, 4, now);  // waits
  // 1,500 bytes/s: a thousandth of its peers, above --min_upload_rate.
  pool.Progress(rec.ids[3], 3000, now + absl::Seconds(2));
  EXPECT_TRUE(pool.Reclaim(now + absl::Seconds(2)).empty());
}

TEST(StagingPoolReclaimTest, TheBarFollowsTheLastUploadsOnly) {
  // Slow uploads long ago, then kRecentUploads fast ones: the old ones no
  // longer lower the bar, and an upload at 300 bytes/s gives way again.
  StagingPool pool(1, 4, TestPolicy());
  Recorder rec;
  absl::Time now = FinishUploads(pool, rec, 0, 4, 400, absl::Seconds(1), t0);
  const int fast = static_cast<int>(StagingPool::kRecentUploads);
  now = FinishUploads(pool, rec, 4, fast, 100'000, absl::Seconds(1), now);
  rec.Acquire(pool, 4 + fast, now);
  rec.Acquire(pool, 5 + fast, now);  // waits
  pool.Progress(rec.ids[4 + fast], 600, now + absl::Seconds(2));
  std::vector<StagingPool::Reclaimed> reclaimed =
      pool.Reclaim(now + absl::Seconds(2));
  ASSERT_EQ(reclaimed.size(), 1u);
  reclaimed[0].Run();
  EXPECT_THAT(rec.preempted[0].second,
              HasSubstr("below --min_upload_rate=1000 bytes/s"));
}

TEST(StagingPoolReclaimTest, PreemptedUploadsDoNotLowerTheBar) {
  // Trickles that were preempted say nothing about the coordinator's speed:
  // one after another, each at 5 bytes/s, every one gives way.
  StagingPool pool(1, 4, TestPolicy());
  Recorder rec;
  absl::Time now = t0;
  rec.Acquire(pool, 0, now);
  for (int i = 0; i < 4; ++i) {
    rec.Acquire(pool, i + 1, now);  // waits
    now += absl::Seconds(2);
    pool.Progress(rec.ids[i], 10, now);
    std::vector<StagingPool::Reclaimed> reclaimed = pool.Reclaim(now);
    ASSERT_EQ(reclaimed.size(), 1u) << i;
    EXPECT_EQ(reclaimed[0].id, rec.ids[i]);
    reclaimed[0].Run();
    rec.Release(pool, i, now);  // to waiter i + 1
  }
  EXPECT_EQ(rec.preempted.size(), 4u);
}

}  // namespace
}  // namespace fedlearn
