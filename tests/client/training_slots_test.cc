#include "client/training_slots.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

TEST(TrainingSlotsTest, NeverMoreThanTheSlotsTrainAtOnce) {
  TrainingSlots slots(2);
  std::atomic<int> training{0}, most{0}, done{0};
  std::vector<std::thread> agents;
  for (int i = 0; i < 6; ++i) {
    agents.emplace_back([&] {
      for (int round = 0; round < 5; ++round) {
        ASSERT_TRUE(slots.Acquire([] { return false; }));
        const int now = ++training;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        absl::SleepFor(absl::Milliseconds(2));
        --training;
        slots.Release();
      }
      ++done;
    });
  }
  for (std::thread& t : agents) t.join();
  EXPECT_EQ(done.load(), 6);  // every agent got its turns
  EXPECT_EQ(most.load(), 2);
}

TEST(TrainingSlotsTest, AWaitingAgentStopsWhenAsked) {
  TrainingSlots slots(1);
  ASSERT_TRUE(slots.Acquire([] { return false; }));
  std::atomic<bool> stop{false};
  bool acquired = true;
  std::thread waiter(
      [&] { acquired = slots.Acquire([&] { return stop.load(); }); });
  absl::SleepFor(absl::Milliseconds(50));
  stop = true;
  waiter.join();  // within ~100 ms of the stop
  EXPECT_FALSE(acquired);
  slots.Release();
  EXPECT_TRUE(slots.Acquire([] { return false; }));  // the slot was not lost
}

}  // namespace
}  // namespace fedlearn
