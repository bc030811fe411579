#include "server/strategy/strategy.h"

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(StrategyTest, EveryNameResolvesWithItsDefaults) {
  EXPECT_THAT(StrategyNames(),
              ElementsAre("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi",
                          "fedadagrad", "fedmedian", "fedtrimmedavg", "krum",
                          "multikrum"));
  for (const std::string& name : StrategyNames()) {
    auto strategy = MakeStrategy(name, {}, 4);
    ASSERT_TRUE(strategy.ok()) << name << ": " << strategy.status();
    const bool robust = name == "fedmedian" || name == "fedtrimmedavg" ||
                        name == "krum" || name == "multikrum";
    // The robust rules keep every update: 4 parameters, 16 bytes each.
    EXPECT_EQ(strategy->aggregator->bytes_per_update(), robust ? 16u : 0u)
        << name;
    EXPECT_TRUE(strategy->transforms.empty()) << name;
  }
  auto fedprox = ResolveStrategy("fedprox", {});
  EXPECT_DOUBLE_EQ(fedprox->proximal_mu(), 0.01);
  auto adam = ResolveStrategy("fedadam", {});
  EXPECT_DOUBLE_EQ(adam->server_learning_rate(), 0.01);
  EXPECT_DOUBLE_EQ(adam->beta_2(), 0.99);
  EXPECT_FALSE(ResolveStrategy("fedavg", {})->has_beta_1());
}

TEST(StrategyTest, GivenKnobsWinAndForeignOnesAreRefused) {
  v1::StrategyConfig c;
  c.set_server_learning_rate(0.5);
  c.set_tau(0.1);
  auto yogi = ResolveStrategy("fedyogi", c);
  ASSERT_TRUE(yogi.ok());
  EXPECT_EQ(yogi->server_learning_rate(), 0.5);
  EXPECT_EQ(yogi->tau(), 0.1);
  EXPECT_EQ(yogi->beta_1(), 0.9);
  auto foreign = ResolveStrategy("fedavgm", c);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(foreign.status().message(),
              HasSubstr("tau does not apply to --strategy=fedavgm"));
  v1::StrategyConfig no_beta_2;
  no_beta_2.set_beta_2(0.9);
  EXPECT_THAT(ResolveStrategy("fedadagrad", no_beta_2).status().message(),
              HasSubstr("beta_2"));
}

TEST(StrategyTest, KnobsOutOfRangeNameTheKnob) {
  auto bad = [](auto set) {
    v1::StrategyConfig c;
    set(&c);
    return std::string(ResolveStrategy("fedadam", c).status().message());
  };
  EXPECT_THAT(bad([](auto* c) { c->set_server_learning_rate(0); }),
              HasSubstr("server_learning_rate must be > 0"));
  EXPECT_THAT(bad([](auto* c) { c->set_beta_1(1.0); }), HasSubstr("beta_1"));
  EXPECT_THAT(bad([](auto* c) { c->set_beta_2(-0.1); }), HasSubstr("beta_2"));
  EXPECT_THAT(bad([](auto* c) { c->set_tau(0); }), HasSubstr("tau"));
  EXPECT_THAT(bad([](auto* c) { c->set_proximal_mu(-1); }),
              HasSubstr("proximal_mu"));
  EXPECT_THAT(bad([](auto* c) { c->set_clip_norm(NAN); }),
              HasSubstr("clip_norm"));
  EXPECT_THAT(ResolveStrategy("fedsgd", {}).status().message(),
              HasSubstr("--strategy: \"fedsgd\": expected one of fedavg"));
}

TEST(StrategyTest, ParsesKnobsInlineOrFromAFile) {
  auto inline_config =
      ParseStrategyConfig("server_learning_rate: 0.1 tau: 0.5");
  ASSERT_TRUE(inline_config.ok());
  EXPECT_EQ(inline_config->server_learning_rate(), 0.1);
  EXPECT_EQ(inline_config->tau(), 0.5);
  const std::string path = ::testing::TempDir() + "/strategy.txtpb";
  std::ofstream(path) << "# FedAvgM a little slower\nserver_momentum: 0.7\n";
  auto from_file = ParseStrategyConfig(path);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(from_file->server_momentum(), 0.7);
  auto bad = ParseStrategyConfig("server_learning_rate 0.1 0.2");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("--strategy_config"));
  std::ofstream(path) << "no_such_knob: 1\n";
  EXPECT_THAT(ParseStrategyConfig(path).status().message(), HasSubstr(path));
}

TEST(StrategyTest, RobustKnobsHaveDefaultsChecksAndOwners) {
  EXPECT_DOUBLE_EQ(ResolveStrategy("fedtrimmedavg", {})->trim_beta(), 0.2);
  EXPECT_EQ(ResolveStrategy("krum", {})->num_byzantine(), 1);
  EXPECT_FALSE(ResolveStrategy("krum", {})->has_num_to_select());
  EXPECT_EQ(ResolveStrategy("multikrum", {})->num_to_select(), 0);
  v1::StrategyConfig c;
  c.set_trim_beta(0.5);
  EXPECT_THAT(ResolveStrategy("fedtrimmedavg", c).status().message(),
              HasSubstr("must be in [0, 0.5)"));
  EXPECT_THAT(ResolveStrategy("fedmedian", c).status().message(),
              HasSubstr("trim_beta does not apply to --strategy=fedmedian"));
  c.Clear();
  c.set_num_to_select(3);
  EXPECT_THAT(ResolveStrategy("krum", c).status().message(),
              HasSubstr("num_to_select does not apply to --strategy=krum"));
  c.Clear();
  c.set_num_byzantine(-1);
  EXPECT_THAT(ResolveStrategy("multikrum", c).status().message(),
              HasSubstr("num_byzantine must be >= 0"));
  // Krum's 2f + 3; Multi-Krum's m + f when larger.
  c.set_num_byzantine(2);
  EXPECT_EQ(MakeStrategy("krum", c, 4)->min_updates, 7);
  c.set_num_to_select(6);
  EXPECT_EQ(MakeStrategy("multikrum", c, 4)->min_updates, 8);
  EXPECT_EQ(MakeStrategy("fedmedian", {}, 4)->min_updates, 1);
}

TEST(StrategyTest, ClipNormBoundsTheUpdatesNorm) {
  v1::StrategyConfig c;
  c.set_clip_norm(5.0);
  auto strategy = MakeStrategy("fedavg", c, 2);
  ASSERT_TRUE(strategy.ok());
  ASSERT_EQ(strategy->transforms.size(), 1u);
  std::vector<float> big = {30.0f, 40.0f};  // norm 50
  strategy->transforms[0]->Apply(absl::MakeSpan(big));
  EXPECT_THAT(big, ElementsAre(3.0f, 4.0f));
  std::vector<float> small = {0.3f, 0.4f};  // norm 0.5: unchanged
  strategy->transforms[0]->Apply(absl::MakeSpan(small));
  EXPECT_THAT(small, ElementsAre(0.3f, 0.4f));
}

TEST(StrategyTest, DpClipsEveryUpdateToExactlyC) {
  DpParams dp;
  dp.clip_norm = 0.75;
  dp.noise_multiplier = 1.0;
  for (const char* name :
       {"fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad"}) {
    auto strategy = MakeStrategy(name, {}, 1000, {}, dp);
    ASSERT_TRUE(strategy.ok()) << name << ": " << strategy.status();
    EXPECT_TRUE(strategy->dp.enabled());
    // DP clips in its aggregator's Stage, not in a transform of its own.
    EXPECT_TRUE(strategy->transforms.empty()) << name;
    ASSERT_EQ(strategy->dp_aggregator, strategy->aggregator.get()) << name;
    // An update of norm ~18 leaves with norm C, direction kept.
    std::vector<float> update(1000);
    for (size_t i = 0; i < update.size(); ++i) {
      update[i] = std::sin(static_cast<float>(i));
    }
    const std::vector<float> before = update;
    auto staged = strategy->aggregator->Stage(absl::MakeSpan(update));
    ASSERT_TRUE(staged.ok());
    EXPECT_FALSE(staged->within_clip);
    EXPECT_NEAR(L2Norm(update), 0.75, 0.75 * 1e-6) << name;
    const double scale = update[1] / before[1];
    for (size_t i = 0; i < update.size(); i += 97) {
      EXPECT_NEAR(update[i], before[i] * scale, 1e-6) << name << " at " << i;
    }
  }
}

TEST(StrategyTest, DpRefusesRobustRulesAndASecondClip) {
  DpParams dp;
  dp.clip_norm = 1;
  dp.noise_multiplier = 1;
  for (const char* name : {"fedmedian", "fedtrimmedavg", "krum", "multikrum"}) {
    auto strategy = MakeStrategy(name, {}, 4, {}, dp);
    EXPECT_EQ(strategy.status().code(), absl::StatusCode::kInvalidArgument)
        << name;
    EXPECT_THAT(strategy.status().message(), HasSubstr(name));
  }
  v1::StrategyConfig c;
  c.set_clip_norm(5.0);
  auto clipped = MakeStrategy("fedavg", c, 4, {}, dp);
  EXPECT_EQ(clipped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(clipped.status().message(), HasSubstr("--dp_clip_norm"));
}

}  // namespace
}  // namespace fedlearn
