#include "server/staging_pool.h"

#include <atomic>
#include <cstdint>
#include <memory>
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

// Records what each Acquire's callback received, in the order callbacks ran.
// Single-threaded tests only.
struct Recorder {
  struct Call {
    int waiter;
    StagingPool::Buffer buffer;
  };
  std::vector<Call> calls;

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
    pool.Acquire(rec.For(i));
    // Served before Acquire returns.
    ASSERT_EQ(rec.calls.size(), static_cast<size_t>(i + 1));
    ASSERT_NE(rec.calls[i].buffer, nullptr);
    EXPECT_EQ(rec.calls[i].buffer->size(), 1000u);
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
  pool.Acquire(rec.For(0));
  pool.Acquire(rec.For(1));
  pool.Acquire(rec.For(2));
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1));
  EXPECT_EQ(pool.in_use(), 2);

  StagingPool::Buffer first = rec.Take(0);
  const std::vector<float>* const released = first.get();
  pool.Release(std::move(first));
  // The waiter receives the very buffer that was released; it stays in use.
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1, 2));
  EXPECT_EQ(rec.calls[2].buffer.get(), released);
  EXPECT_EQ(pool.in_use(), 2);
}

TEST(StagingPoolTest, WaitersAreServedFirstComeFirstServed) {
  StagingPool pool(1, 4);
  Recorder rec;
  for (int i = 0; i < 5; ++i) pool.Acquire(rec.For(i));
  EXPECT_THAT(rec.Order(), ElementsAre(0));
  for (int i = 0; i < 4; ++i) pool.Release(rec.Take(i));
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ(pool.in_use(), 1);
  pool.Release(rec.Take(4));
  EXPECT_EQ(pool.in_use(), 0);
}

TEST(StagingPoolTest, ReleasedBuffersAreReused) {
  StagingPool pool(1, 8);
  Recorder rec;
  pool.Acquire(rec.For(0));
  StagingPool::Buffer buffer = rec.Take(0);
  (*buffer)[0] = 42.0f;
  const std::vector<float>* const address = buffer.get();
  pool.Release(std::move(buffer));
  EXPECT_EQ(pool.in_use(), 0);

  pool.Acquire(rec.For(1));
  ASSERT_EQ(rec.calls.size(), 2u);
  EXPECT_EQ(rec.calls[1].buffer.get(), address);
  EXPECT_EQ(rec.calls[1].buffer->size(), 8u);
  EXPECT_EQ(pool.in_use(), 1);
}

TEST(StagingPoolTest, InUseCountsBuffersHandedOut) {
  StagingPool pool(3, 2);
  Recorder rec;
  pool.Acquire(rec.For(0));
  pool.Acquire(rec.For(1));
  EXPECT_EQ(pool.in_use(), 2);
  pool.Release(rec.Take(1));
  EXPECT_EQ(pool.in_use(), 1);
  pool.Release(rec.Take(0));
  EXPECT_EQ(pool.in_use(), 0);
  for (int i = 2; i < 6; ++i) pool.Acquire(rec.For(i));  // 3 served, 1 waits
  EXPECT_EQ(pool.in_use(), 3);
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1, 2, 3, 4));
}

TEST(StagingPoolTest, IdsAreDistinct) {
  StagingPool pool(1, 1);
  Recorder rec;
  const uint64_t a = pool.Acquire(rec.For(0));  // served
  const uint64_t b = pool.Acquire(rec.For(1));  // queued
  const uint64_t c = pool.Acquire(rec.For(2));  // queued
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  EXPECT_NE(a, c);
}

TEST(StagingPoolTest, CancelOfAQueuedWaiterCallsItWithNullptrOnce) {
  StagingPool pool(1, 4);
  Recorder rec;
  pool.Acquire(rec.For(0));
  const uint64_t id1 = pool.Acquire(rec.For(1));
  pool.Acquire(rec.For(2));

  pool.Cancel(id1);
  ASSERT_THAT(rec.Order(), ElementsAre(0, 1));
  EXPECT_EQ(rec.calls[1].buffer, nullptr);
  EXPECT_EQ(pool.in_use(), 1);

  // A second Cancel of the same id does nothing.
  pool.Cancel(id1);
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1));

  // The cancelled waiter is out of the queue: the next buffer goes to waiter 2.
  pool.Release(rec.Take(0));
  EXPECT_THAT(rec.Order(), ElementsAre(0, 1, 2));
  EXPECT_NE(rec.calls[2].buffer, nullptr);
  EXPECT_EQ(pool.in_use(), 1);
}

TEST(StagingPoolTest, CancelOfAServedIdDoesNothing) {
  StagingPool pool(1, 4);
  Recorder rec;
  const uint64_t id0 = pool.Acquire(rec.For(0));
  const uint64_t id1 = pool.Acquire(rec.For(1));
  pool.Cancel(id0);  // served at once
  EXPECT_THAT(rec.Order(), ElementsAre(0));
  EXPECT_NE(rec.calls[0].buffer, nullptr);
  EXPECT_EQ(pool.in_use(), 1);

  pool.Release(rec.Take(0));  // serves waiter 1
  pool.Cancel(id1);           // served from the queue
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
  StagingPool::Buffer held;
  pool.Acquire([&](StagingPool::Buffer b) { held = std::move(b); });
  for (int i = 1; i <= 3; ++i) {
    pool.Acquire([&pool, &order, i](StagingPool::Buffer b) {
      order.push_back(i);
      EXPECT_EQ(pool.in_use(), 1);
      pool.Release(std::move(b));
    });
  }
  EXPECT_TRUE(order.empty());
  pool.Release(std::move(held));
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
        pool.Acquire([&](StagingPool::Buffer b) {
          buffer = std::move(b);
          got.Notify();
        });
        got.WaitForNotification();
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
        pool.Release(std::move(buffer));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(served.load(), kThreads * kRounds);
  EXPECT_LE(max_holding.load(), kBuffers);
  EXPECT_EQ(pool.in_use(), 0);
}

}  // namespace
}  // namespace fedlearn
