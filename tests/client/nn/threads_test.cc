#include "client/nn/threads.h"

#include <Eigen/Core>
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace fedlearn::nn {
namespace {

// Every index runs exactly once per Run, index 0 on the caller and the others
// on distinct helper threads, and Run returns only when all of them are done.
TEST(ThreadGroupTest, RunsEachIndexOnceAndWaitsForAll) {
  ThreadGroup group;
  for (int n : {1, 3, 2, 4, 1, 3}) {
    SCOPED_TRACE(n);
    std::vector<std::atomic<int>> runs(n);
    std::vector<std::thread::id> ids(n);
    group.Run(n, [&](int i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(i == 0 ? 0 : 5));
      ids[i] = std::this_thread::get_id();
      runs[i].fetch_add(1);
    });
    for (int i = 0; i < n; ++i) EXPECT_EQ(runs[i].load(), 1) << "index " << i;
    EXPECT_EQ(ids[0], std::this_thread::get_id());
    EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(),
              static_cast<size_t>(n));
  }
}

// Many short Runs in a row: no job is lost or run twice when helpers wake late.
TEST(ThreadGroupTest, BackToBackRunsAllComplete) {
  ThreadGroup group;
  std::atomic<int> total{0};
  for (int r = 0; r < 2000; ++r) {
    group.Run(2 + r % 2, [&](int) { total.fetch_add(1); });
  }
  EXPECT_EQ(total.load(), 1000 * 2 + 1000 * 3);
}

// Agents in one process may hold overlapping scopes: products stay on one
// thread until the last scope goes, and a SetComputeThreads made meanwhile
// takes effect then.
TEST(SingleThreadedGemmTest, OverlappingScopesRestoreTheCountOnceAllAreGone) {
  const int before = Eigen::nbThreads();
  SetComputeThreads(2);
  {
    auto outer = std::make_unique<SingleThreadedGemm>();
    EXPECT_EQ(Eigen::nbThreads(), 1);
    {
      SingleThreadedGemm inner;
      EXPECT_EQ(Eigen::nbThreads(), 1);
    }
    EXPECT_EQ(Eigen::nbThreads(), 1) << "an outer scope is still alive";
    SetComputeThreads(3);
    EXPECT_EQ(Eigen::nbThreads(), 1) << "deferred until the scope goes";
    outer.reset();
    EXPECT_EQ(Eigen::nbThreads(), 3);
  }
  SetComputeThreads(before);
}

}  // namespace
}  // namespace fedlearn::nn
