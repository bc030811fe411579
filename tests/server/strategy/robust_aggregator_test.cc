#include "server/strategy/robust_aggregator.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

UpdateStore::Options InMemory(size_t num_parameters) {
  return {num_parameters, size_t{1} << 30, ""};
}

// `in_memory` updates fit the budget; the rest spill to the test's temp dir.
UpdateStore::Options Spilling(size_t num_parameters, int in_memory) {
  return {num_parameters, num_parameters * 4 * static_cast<size_t>(in_memory),
          ::testing::TempDir()};
}

std::vector<double> Finished(Aggregator& aggregator) {
  absl::StatusOr<absl::Span<const double>> delta = aggregator.Finish();
  EXPECT_TRUE(delta.ok()) << delta.status();
  if (!delta.ok()) return {};
  return std::vector<double>(delta->begin(), delta->end());
}

// Open file descriptors of this process: a spill file is one until freed.
int OpenFiles() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;
}

TEST(MedianAggregatorTest, OddCountTakesTheMiddleValue) {
  MedianAggregator median(InMemory(3));
  median.Fold(1, 1, std::vector<float>{1, 5, -2});
  median.Fold(1, 1, std::vector<float>{3, 1, 0});
  median.Fold(1, 1, std::vector<float>{2, 2, 10});
  EXPECT_THAT(Finished(median), ElementsAre(2, 2, 0));
}

TEST(MedianAggregatorTest, EvenCountAveragesTheTwoMiddleValuesAndTiesHold) {
  MedianAggregator median(InMemory(3));
  median.Fold(1, 1, std::vector<float>{1, 1, 0.5f});
  median.Fold(1, 1, std::vector<float>{4, 1, 0.25f});
  median.Fold(1, 1, std::vector<float>{2, 1, -7});
  median.Fold(1, 1, std::vector<float>{8, 5, 9});
  // Sorted columns: {1,2,4,8} -> 3; {1,1,1,5} -> 1; {-7,0.25,0.5,9} -> 0.375.
  EXPECT_THAT(Finished(median), ElementsAre(3, 1, 0.375));
}

TEST(MedianAggregatorTest, IgnoresTheExampleCountAndScalesEachUpdate) {
  MedianAggregator median(InMemory(1));
  // A client claiming a million examples gets one vote like the others.
  median.Fold(1e6, 1, std::vector<float>{100});
  median.Fold(1, 1, std::vector<float>{1});
  median.Fold(1, 0.5, std::vector<float>{4});  // counts as 2
  EXPECT_THAT(Finished(median), ElementsAre(2));
}

TEST(TrimmedMeanAggregatorTest, DropsFloorBetaNFromEachEnd) {
  // n = 5, beta 0.2: one from each end; {1,2,3,4,100} -> mean(2,3,4) = 3.
  TrimmedMeanAggregator five(InMemory(2), 0.2);
  for (float v : {100.0f, 1.0f, 3.0f, 2.0f, 4.0f}) {
    five.Fold(1, 1, std::vector<float>{v, -v});
  }
  EXPECT_THAT(Finished(five), ElementsAre(3, -3));
  // n = 4, beta 0.2: floor(0.8) = 0, the plain mean.
  TrimmedMeanAggregator four(InMemory(1), 0.2);
  for (float v : {1.0f, 2.0f, 3.0f, 10.0f}) four.Fold(1, 1, {v});
  EXPECT_THAT(Finished(four), ElementsAre(4));
  // n = 6, beta 0.49: floor(2.94) = 2 from each end; ties {5,5} -> 5.
  TrimmedMeanAggregator six(InMemory(1), 0.49);
  for (float v : {5.0f, -100.0f, 5.0f, 100.0f, 7.0f, 0.0f}) six.Fold(1, 1, {v});
  EXPECT_THAT(Finished(six), ElementsAre(5));
}

// 1-d updates {0, 1, 2, 10, 11}, f = 1: each scores its n - f - 2 = 2 nearest
// squared distances. 0: 1+4 = 5; 1: 1+1 = 2; 2: 1+4 = 5; 10: 1+64 = 65;
// 11: 1+81 = 82.
void FoldKrumExample(KrumAggregator& krum) {
  for (float v : {0.0f, 1.0f, 2.0f, 10.0f, 11.0f}) krum.Fold(1, 1, {v});
}

TEST(KrumAggregatorTest, KrumPicksTheUpdateWithTheLowestScore) {
  KrumAggregator krum(InMemory(1), /*num_byzantine=*/1, /*num_to_select=*/1);
  FoldKrumExample(krum);
  EXPECT_THAT(Finished(krum), ElementsAre(1));
  EXPECT_THAT(krum.selected(), ElementsAre(1));
}

TEST(KrumAggregatorTest, MultiKrumAveragesTheBestAndBreaksTiesByArrival) {
  // Scores 2 (update 1), then 5 for updates 0 and 2: the earlier, 0, wins.
  KrumAggregator two(InMemory(1), 1, 2);
  FoldKrumExample(two);
  EXPECT_THAT(Finished(two), ElementsAre(0.5));
  EXPECT_THAT(two.selected(), ElementsAre(0, 1));
  // num_to_select 0: n - f = 4, every update but 11.
  KrumAggregator all(InMemory(1), 1, 0);
  FoldKrumExample(all);
  EXPECT_THAT(Finished(all), ElementsAre(13.0 / 4));
  EXPECT_THAT(all.selected(), ElementsAre(0, 1, 2, 3));
}

TEST(KrumAggregatorTest, NeedsTwoFPlusThreeUpdates) {
  KrumAggregator krum(InMemory(1), /*num_byzantine=*/1, 1);
  for (float v : {0.0f, 1.0f, 2.0f, 3.0f}) krum.Fold(1, 1, {v});
  absl::StatusOr<absl::Span<const double>> delta = krum.Finish();
  EXPECT_EQ(delta.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(delta.status().message(),
              HasSubstr("needs at least 5 updates, got 4"));
  // f = 0 is plain Krum on the n - 2 nearest: with 3 updates, 1 neighbour.
  KrumAggregator f0(InMemory(1), 0, 1);
  for (float v : {0.0f, 4.0f, 5.0f}) f0.Fold(1, 1, {v});
  EXPECT_THAT(Finished(f0), ElementsAre(4));  // 4 and 5 score 1; 4 first
}

// Updates over several stripes (the last one short), random values.
std::vector<std::vector<float>> RandomUpdates(int n, size_t p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<std::vector<float>> updates(n, std::vector<float>(p));
  for (auto& u : updates) {
    for (float& v : u) v = normal(rng);
  }
  return updates;
}

template <typename Make>
void ExpectSpillingChangesNothing(Make make) {
  const size_t p = 2 * StoredAggregator::kStripe + 123;
  const auto updates = RandomUpdates(7, p, 7);
  std::vector<std::vector<double>> results;
  for (UpdateStore::Options options :
       {InMemory(p), Spilling(p, 0), Spilling(p, 3)}) {
    std::unique_ptr<StoredAggregator> aggregator = make(options);
    for (const auto& u : updates) aggregator->Fold(1, 1, u);
    const int in_memory = options.memory_budget >= p * 4 * 7 ? 7
                          : options.memory_budget == 0       ? 0
                                                             : 3;
    EXPECT_EQ(aggregator->store().spilled(), 7 - in_memory);
    results.push_back(Finished(*aggregator));
  }
  ASSERT_EQ(results[0].size(), p);
  EXPECT_EQ(results[1], results[0]);  // bit for bit
  EXPECT_EQ(results[2], results[0]);
}

TEST(StoredAggregatorTest, SpillingGivesBitIdenticalResults) {
  ExpectSpillingChangesNothing([](UpdateStore::Options o) {
    return std::make_unique<MedianAggregator>(o);
  });
  ExpectSpillingChangesNothing([](UpdateStore::Options o) {
    return std::make_unique<TrimmedMeanAggregator>(o, 0.2);
  });
  ExpectSpillingChangesNothing([](UpdateStore::Options o) {
    return std::make_unique<KrumAggregator>(o, 2, 3);
  });
}

TEST(StoredAggregatorTest, StripesAgreeWithAColumnComputedWhole) {
  const size_t p = StoredAggregator::kStripe + 5;
  const auto updates = RandomUpdates(5, p, 11);
  MedianAggregator median(InMemory(p));
  for (const auto& u : updates) median.Fold(1, 1, u);
  const std::vector<double> delta = Finished(median);
  for (size_t j : {size_t{0}, StoredAggregator::kStripe - 1,
                   StoredAggregator::kStripe, p - 1}) {
    std::vector<float> column;
    for (const auto& u : updates) column.push_back(u[j]);
    std::sort(column.begin(), column.end());
    EXPECT_EQ(delta[j], column[2]) << j;
  }
}

TEST(StoredAggregatorTest, AStagedUpdateNotFoldedChangesNothing) {
  const size_t p = 1000;
  const auto updates = RandomUpdates(4, p, 3);
  const int files_before = OpenFiles();
  MedianAggregator with(Spilling(p, 1));
  MedianAggregator without(Spilling(p, 1));
  for (int i = 0; i < 3; ++i) {
    with.Fold(1, 1, updates[i]);
    without.Fold(1, 1, updates[i]);
    if (i == 0) {
      // A push staged (in the budget's last slot or a spill file), then
      // rejected: dropped without a fold.
      std::vector<float> rejected = updates[3];
      absl::StatusOr<Aggregator::Staged> staged =
          with.Stage(absl::MakeSpan(rejected));
      ASSERT_TRUE(staged.ok()) << staged.status();
    }
  }
  EXPECT_EQ(with.count(), 3);
  EXPECT_EQ(with.store().memory_in_use(), p * 4);
  EXPECT_EQ(Finished(with), Finished(without));
  // Reset gives every byte and file back.
  with.Reset();
  without.Reset();
  EXPECT_EQ(with.count(), 0);
  EXPECT_EQ(with.store().memory_in_use(), 0u);
  EXPECT_EQ(OpenFiles(), files_before);
}

TEST(StoredAggregatorTest, SpillFilesHaveNoNames) {
  const std::string dir = ::testing::TempDir() + "spill-names-XXXXXX";
  std::string path = dir;
  ASSERT_NE(mkdtemp(path.data()), nullptr);
  MedianAggregator median({100, 0, path});
  for (const auto& u : RandomUpdates(3, 100, 5)) median.Fold(1, 1, u);
  EXPECT_EQ(median.store().spilled(), 3);
  int names = 0;
  DIR* d = opendir(path.c_str());
  for (dirent* e = readdir(d); e != nullptr; e = readdir(d)) {
    if (e->d_name[0] != '.') ++names;
  }
  closedir(d);
  EXPECT_EQ(names, 0);  // a crash leaves nothing behind
}

TEST(StoredAggregatorTest, BudgetSpentWithNowhereToSpillIsResourceExhausted) {
  MedianAggregator median({10, 80, ""});  // two updates
  std::vector<float> update(10);
  EXPECT_TRUE(median.Stage(absl::MakeSpan(update)).ok());
  absl::StatusOr<Aggregator::Staged> a = median.Stage(absl::MakeSpan(update));
  absl::StatusOr<Aggregator::Staged> b = median.Stage(absl::MakeSpan(update));
  ASSERT_TRUE(a.ok());  // the first one's share came back when it was dropped
  ASSERT_TRUE(b.ok());
  absl::StatusOr<Aggregator::Staged> c = median.Stage(absl::MakeSpan(update));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("no spill directory"));
}

TEST(StoredAggregatorTest, AnUnwritableSpillDirectoryIsAClearError) {
  MedianAggregator median({10, 0, "/proc/no-such-dir"});
  std::vector<float> update(10);
  absl::StatusOr<Aggregator::Staged> staged =
      median.Stage(absl::MakeSpan(update));
  EXPECT_EQ(staged.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(staged.status().message(),
              HasSubstr("cannot make a spill file in /proc/no-such-dir"));
}

long PeakRssKb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// 50 updates of 4 MB (200 MB) against an 8 MiB budget: memory grows by the
// budget, the stripes (50 x 64 KiB) and the aggregate (a double per
// parameter, as the streaming mean's), not with the number of updates.
TEST(StoredAggregatorTest, PeakMemoryStaysWithinTheBudget) {
  const size_t p = size_t{1} << 20;  // 4 MB of float32 per update
  const size_t budget = size_t{8} << 20;
  auto median = std::make_unique<MedianAggregator>(
      UpdateStore::Options{p, budget, ::testing::TempDir()});
  std::vector<float> update(p);
  for (size_t j = 0; j < p; ++j) update[j] = static_cast<float>(j % 97);
  const long before = PeakRssKb();
  for (int i = 0; i < 50; ++i) {
    update[i] = static_cast<float>(-i);  // each update a little different
    median->Fold(1, 1, update);
  }
  EXPECT_EQ(median->store().spilled(), 48);
  const std::vector<double> delta = Finished(*median);
  EXPECT_EQ(delta[100], 100 % 97);
  const long grown_kb = PeakRssKb() - before;
  const size_t working = budget + 50 * StoredAggregator::kStripe * 4 + p * 8 +
                         p * 8;  // the aggregate, and its copy in `delta`
  const long allowed_kb = static_cast<long>(working / 1024) +
                          4096;  // allocator and page-table slack
  EXPECT_LT(grown_kb, allowed_kb)
      << "peak RSS grew " << grown_kb << " KiB for 200 MB of updates";
}

}  // namespace
}  // namespace fedlearn
