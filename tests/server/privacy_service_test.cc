// Central differential privacy end to end: a real coordinator over gRPC on a
// loopback socket, scripted clients pushing hand-made updates (README,
// "Differential privacy").

#include <grpcpp/create_channel.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/privacy/rdp_accountant.h"
#include "server/run_controller.h"
#include "tests/server/scripted_clients.h"
#include "tests/util/files.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;
using testing::Header;
using testing::NextTask;
using testing::SmallRun;

// SmallRun (mlp_2nn, 3 clients a round) with DP: C = 1, z as given, and no
// stop but max_rounds.
CoordinatorOptions PrivateRun(double z) {
  CoordinatorOptions o = SmallRun();
  o.dp_clip_norm = 1.0;
  o.dp_noise_multiplier = z;
  o.convergence_threshold = -std::numeric_limits<double>::infinity();
  return o;
}

// A private run (z 0.8, C 1) saved in `dir`, for 10 rounds: a resume in the
// tests is mid-training.
CoordinatorOptions SavedPrivateRun(const testing::ScopedTempDir& dir) {
  CoordinatorOptions o = PrivateRun(/*z=*/0.8);
  o.max_rounds = 10;
  o.state_dir = dir.Path("state");
  return o;
}

// Each changes a private run's settings (z 0.8, C 1) to others a resume
// must refuse: another z, another C, no DP at all.
std::vector<std::function<void(CoordinatorOptions&)>> OtherPrivacySettings() {
  return {[](CoordinatorOptions& c) { c.dp_noise_multiplier = 2.0; },
          [](CoordinatorOptions& c) { c.dp_clip_norm = 0.5; },
          [](CoordinatorOptions& c) {
            c.dp_noise_multiplier = 0;
            c.dp_clip_norm = 0;
          }};
}

// Starting on `o`'s state directory with each of OtherPrivacySettings is
// refused, FAILED_PRECONDITION with `why` in the message.
void ExpectOtherSettingsRefused(const CoordinatorOptions& o,
                                const std::string& why) {
  for (auto change : OtherPrivacySettings()) {
    CoordinatorOptions other = o;
    change(other);
    auto refused = CoordinatorServer::Start(other, "127.0.0.1:0");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(), HasSubstr(why));
  }
}

class PrivacyServiceTest : public ::testing::Test {
 protected:
  void Start(const CoordinatorOptions& options) {
    channel_ = testing::StartCoordinator(options, &server_);
    ASSERT_NE(channel_, nullptr);
  }

  std::vector<std::unique_ptr<CoordinatorClient>> JoinAll(int n) {
    std::vector<std::unique_ptr<CoordinatorClient>> clients;
    for (int i = 0; i < n; ++i) {
      clients.push_back(std::make_unique<CoordinatorClient>(channel_));
      auto joined = clients.back()->Join(v1::JoinRequest());
      EXPECT_TRUE(joined.ok()) << joined.status();
    }
    return clients;
  }

  // Every client takes TRAIN for `round` and pushes `value` in every
  // parameter.
  void TrainRound(const std::vector<std::unique_ptr<CoordinatorClient>>& all,
                  int64_t round, float value) {
    for (auto& c : all) {
      ASSERT_EQ(NextTask(*c).task.type(), v1::TASK_TYPE_TRAIN);
      const std::vector<float> delta(NumParameters(), value);
      auto pushed = c->PushUpdate(Header(round, 100, 1.0), delta);
      ASSERT_TRUE(pushed.ok()) << pushed.status();
    }
  }

  // Three clients train rounds 1 and 2 with 0.25 everywhere, then leave.
  void TrainTwoRoundsAndStop() {
    auto clients = JoinAll(3);
    TrainRound(clients, 1, 0.25f);
    TrainRound(clients, 2, 0.25f);
  }

  std::vector<float> Global() {
    return *server_->controller().global_weights();
  }
  v1::GetStatusResponse Status() { return server_->controller().GetStatus(); }
  size_t NumParameters() { return server_->controller().spec().num_parameters; }

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

// The next model is the old one plus (sum of the clipped updates + N(0,
// (zC)^2)) / (clients sampled), whatever each client claims as num_examples
// and however few of the sampled answered.
TEST_F(PrivacyServiceTest, TheModelMovesByTheClippedSumPlusNoiseOverSampled) {
  CoordinatorOptions o = PrivateRun(/*z=*/0.01);
  o.tolerance = 0.34;  // quorum 2 of the 3 sampled
  Start(o);
  auto clients = JoinAll(3);
  const std::vector<float> before = Global();
  const size_t d = NumParameters();
  // Two of three push deltas of norm sqrt(d), clipped to 1: client 0 +1 in
  // every coordinate, claiming 1000 times the examples; client 1 +1 in the
  // even coordinates and -1 in the odd ones. Each clipped coordinate is
  // +-1/sqrt(d): the sum is 2/sqrt(d) in even coordinates and 0 in odd ones,
  // and Delta a third of that. (A mean weighted by examples would give about
  // 1/sqrt(d) everywhere; one over the 2 that answered, 1/sqrt(d) and 0.)
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(NextTask(*clients[i]).task.type(), v1::TASK_TYPE_TRAIN);
    std::vector<float> delta(d, 1.0f);
    if (i == 1) {
      for (size_t j = 1; j < d; j += 2) delta[j] = -1.0f;
    }
    auto pushed =
        clients[i]->PushUpdate(Header(1, i == 0 ? 100000 : 100, 1.0), delta);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
  }
  ASSERT_EQ(Status().history_size(), 1);
  ASSERT_EQ(Status().history(0).outcome(), "quorum");
  const std::vector<float> after = Global();
  const double even = 2.0 / 3.0 / std::sqrt(static_cast<double>(d));
  const double noise = 0.01 * 1.0 / 3.0;  // z C / n
  double sum = 0, squares = 0;
  for (size_t i = 0; i < d; ++i) {
    const double signal = i % 2 == 0 ? even : 0.0;
    const double residual = (double{after[i]} - before[i]) - signal;
    sum += residual;
    squares += residual * residual;
  }
  // Six standard errors: the mean residual is the noise's mean, the mean
  // square its variance (plus float rounding far below either bound).
  EXPECT_NEAR(sum / d, 0.0, 6 * noise / std::sqrt(d));
  EXPECT_NEAR(squares / d, noise * noise,
              6 * noise * noise * std::sqrt(2.0 / d));
}

TEST_F(PrivacyServiceTest, EpsilonIsReportedPerRoundAndTheBudgetStopsTraining) {
  CoordinatorOptions o = PrivateRun(/*z=*/1.0);
  o.max_rounds = 10;
  // 3 of 3 alive sampled: q = 1. A budget of two rounds' epsilon.
  PrivacyAccountant expected(o.dp_delta, 0);
  expected.Charge(1.0, 1.0);
  const double after_one = expected.epsilon();
  expected.Charge(1.0, 1.0);
  o.dp_max_epsilon = expected.epsilon() * (1 + 1e-9);
  Start(o);
  auto clients = JoinAll(3);
  TrainRound(clients, 1, 0.5f);
  v1::GetStatusResponse status = Status();
  ASSERT_TRUE(status.has_privacy());
  EXPECT_DOUBLE_EQ(status.privacy().epsilon(), after_one);
  EXPECT_EQ(status.privacy().rounds(), 1);
  EXPECT_DOUBLE_EQ(status.privacy().noise_multiplier(), 1.0);
  EXPECT_DOUBLE_EQ(status.privacy().clip_norm(), 1.0);
  EXPECT_DOUBLE_EQ(status.history(0).dp_epsilon(), after_one);
  EXPECT_DOUBLE_EQ(status.history(0).dp_sampling_rate(), 1.0);
  EXPECT_EQ(status.phase(), v1::PHASE_TRAINING);
  // A client's own update norm is not shown under DP.
  for (const v1::ClientInfo& c : status.clients()) {
    EXPECT_EQ(c.last_update_norm(), 0.0) << c.client_id();
  }

  TrainRound(clients, 2, 0.5f);
  status = Status();
  EXPECT_DOUBLE_EQ(status.privacy().epsilon(), expected.epsilon());
  EXPECT_LE(status.privacy().epsilon(), o.dp_max_epsilon);
  // A third round would pass the budget: training stops before it, and the
  // evaluation phase runs as after convergence.
  EXPECT_EQ(status.phase(), v1::PHASE_EVALUATING);
  EXPECT_EQ(status.stop_reason(), "privacy_budget");
  EXPECT_EQ(NextTask(*clients[0]).task.type(), v1::TASK_TYPE_EVALUATE);
}

TEST_F(PrivacyServiceTest, AResumedRunKeepsTheEpsilonItSpent) {
  testing::ScopedTempDir dir;
  const CoordinatorOptions o = SavedPrivateRun(dir);
  Start(o);
  TrainTwoRoundsAndStop();
  const double spent = Status().privacy().epsilon();
  ASSERT_GT(spent, 0);
  server_.reset();

  // Resumed: the two recorded rounds, and one more for a release a crash may
  // have left unrecorded (the model goes out before its save).
  Start(o);
  const v1::GetStatusResponse resumed = Status();
  EXPECT_EQ(resumed.round(), 3);
  PrivacyAccountant expected(o.dp_delta, 0);
  for (int r = 0; r < 3; ++r) expected.Charge(1.0, 0.8);
  EXPECT_GT(resumed.privacy().epsilon(), spent);
  EXPECT_DOUBLE_EQ(resumed.privacy().epsilon(), expected.epsilon());
  EXPECT_EQ(resumed.privacy().rounds(), 3);
  // The third round adds to it; a second resume adds its own unrecorded one.
  auto clients = JoinAll(3);
  TrainRound(clients, 3, 0.25f);
  expected.Charge(1.0, 0.8);
  EXPECT_DOUBLE_EQ(Status().privacy().epsilon(), expected.epsilon());
  clients.clear();
  server_.reset();
  Start(o);
  expected.Charge(1.0, 0.8);
  EXPECT_DOUBLE_EQ(Status().privacy().epsilon(), expected.epsilon());
  EXPECT_EQ(Status().privacy().rounds(), 5);
  server_.reset();

  // Other privacy settings on the same directory are refused, as another
  // strategy would be.
  ExpectOtherSettingsRefused(o, "privacy settings");
}

// The round a resume charges for a release its crash may have left
// unrecorded is on disk before the resumed run releases anything: a second
// crash before the next save (here: a shutdown right after the resume) finds
// that charge and adds its own, so two possible releases are charged twice,
// not once.
TEST_F(PrivacyServiceTest, AResumesChargeIsSavedBeforeAnythingIsReleased) {
  testing::ScopedTempDir dir;
  const CoordinatorOptions o = SavedPrivateRun(dir);
  Start(o);
  TrainTwoRoundsAndStop();
  server_.reset();
  Start(o);
  EXPECT_EQ(Status().privacy().rounds(), 3);
  server_.reset();
  Start(o);
  PrivacyAccountant expected(o.dp_delta, 0);
  for (int r = 0; r < 4; ++r) expected.Charge(1.0, 0.8);
  EXPECT_EQ(Status().privacy().rounds(), 4);
  EXPECT_DOUBLE_EQ(Status().privacy().epsilon(), expected.epsilon());
}

// A private run whose save fails releases no further round: the one just
// released is unrecorded, and a restart charges one round for it, so a
// second unrecorded release would be under-charged. Training stops; the
// evaluation phase runs.
TEST_F(PrivacyServiceTest, AFailedSaveStopsAPrivateRunsTraining) {
  testing::ScopedTempDir dir;
  const CoordinatorOptions o = SavedPrivateRun(dir);
  Start(o);
  auto clients = JoinAll(3);
  TrainRound(clients, 1, 0.25f);
  EXPECT_EQ(Status().phase(), v1::PHASE_TRAINING);
  // The state file's name taken by a directory: the next save's rename
  // fails, whoever runs the test (root included).
  const std::string state = dir.Path("state/state.binpb");
  ASSERT_TRUE(std::filesystem::remove(state));
  ASSERT_TRUE(std::filesystem::create_directory(state));
  TrainRound(clients, 2, 0.25f);  // its reply comes after the failed save
  const v1::GetStatusResponse status = Status();
  EXPECT_EQ(status.phase(), v1::PHASE_EVALUATING);
  EXPECT_EQ(status.stop_reason(), "state_not_saved");
  EXPECT_EQ(status.round(), 2);
  EXPECT_EQ(NextTask(*clients[0]).task.type(), v1::TASK_TYPE_EVALUATE);
}

// Before any round is released and recorded, the state still says which
// privacy settings the run trains with: a crash may have released a round
// without its record, and the resumed run charges it with its own z, so a
// resume with other settings is refused then too.
TEST_F(PrivacyServiceTest, SettingsAreKeptBeforeAnyRoundIsRecorded) {
  testing::ScopedTempDir dir;
  CoordinatorOptions o = PrivateRun(/*z=*/0.8);
  o.state_dir = dir.Path("state");
  o.round_timeout = absl::Milliseconds(300);
  Start(o);
  {
    auto clients = JoinAll(3);  // selected, never pushing: abandoned
    ASSERT_TRUE(server_->controller().AwaitHistory(1, testing::kWait));
  }
  server_.reset();
  ExpectOtherSettingsRefused(o, "trains with --dp_noise_multiplier=0.8");
  // With its own settings it resumes.
  Start(o);
  EXPECT_EQ(Status().round(), 1);
}

TEST_F(PrivacyServiceTest, TheNoiseDoesNotFollowTheSeed) {
  // Two runs with the same --seed, the same clients and the same updates: the
  // initial models agree to the bit, the noised ones do not.
  std::vector<std::vector<float>> before, after;
  for (int run = 0; run < 2; ++run) {
    Start(PrivateRun(/*z=*/1.0));
    auto clients = JoinAll(3);
    before.push_back(Global());
    TrainRound(clients, 1, 0.5f);
    after.push_back(Global());
    clients.clear();
    server_.reset();
  }
  EXPECT_EQ(before[0], before[1]);
  // Noise that followed the seed would make every coordinate agree. Two
  // independent draws may still round to the same float now and then (one
  // coordinate of 199,210 did so in a CI run), so a handful are allowed.
  size_t same = 0;
  for (size_t i = 0; i < after[0].size(); ++i)
    same += after[0][i] == after[1][i];
  EXPECT_LT(same, after[0].size() / 1000);
}

TEST_F(PrivacyServiceTest, AdaptiveClipNormIsRecordedAndSurvivesARestart) {
  testing::ScopedTempDir dir;
  CoordinatorOptions o = PrivateRun(/*z=*/0.01);
  o.dp_target_quantile = 0.5;  // sigma_b: max(3 / 20, z) = 0.15
  o.state_dir = dir.Path("state");
  Start(o);
  auto clients = JoinAll(3);
  // Every update (norm 0.5 sqrt(d)) is over C = 1: the noised share within C
  // is 0 +- 0.05, and C grows by about exp(0.2 x 0.5).
  TrainRound(clients, 1, 0.5f);
  v1::GetStatusResponse status = Status();
  const v1::RoundRecord& r = status.history(0);
  EXPECT_EQ(r.dp_clip_norm(), 1.0);
  EXPECT_NEAR(r.dp_next_clip_norm(), std::exp(0.1), 0.05);
  EXPECT_EQ(status.privacy().clip_norm(), r.dp_next_clip_norm());
  EXPECT_EQ(status.privacy().target_quantile(), 0.5);
  const double next = r.dp_next_clip_norm();
  clients.clear();
  server_.reset();

  Start(o);
  EXPECT_EQ(Status().privacy().clip_norm(), next);
  clients = JoinAll(3);
  TrainRound(clients, 2, 0.5f);
  EXPECT_EQ(Status().history(1).dp_clip_norm(), next);
}

TEST(PrivacyOptionsTest, BadCombinationsNameTheFlag) {
  auto error = [](CoordinatorOptions o) {
    return std::string(o.Validate().message());
  };
  CoordinatorOptions o = PrivateRun(1.0);
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();

  CoordinatorOptions no_clip = o;
  no_clip.dp_clip_norm = 0;
  EXPECT_THAT(error(no_clip), HasSubstr("--dp_clip_norm > 0"));
  CoordinatorOptions clip_only = o;
  clip_only.dp_noise_multiplier = 0;
  EXPECT_THAT(error(clip_only), HasSubstr("no privacy"));
  CoordinatorOptions budget_only = clip_only;
  budget_only.dp_clip_norm = 0;
  budget_only.dp_max_epsilon = 3;
  EXPECT_THAT(error(budget_only), HasSubstr("--dp_max_epsilon"));
  CoordinatorOptions async = o;
  async.mode = Mode::kAsync;
  EXPECT_THAT(error(async), HasSubstr("--mode=rounds"));
  for (double delta : {0.0, 1.0, -1e-5}) {
    CoordinatorOptions bad = o;
    bad.dp_delta = delta;
    EXPECT_THAT(error(bad), HasSubstr("--dp_delta")) << delta;
  }
  CoordinatorOptions negative = o;
  negative.dp_noise_multiplier = -1;
  EXPECT_THAT(error(negative), HasSubstr("--dp_noise_multiplier"));
  CoordinatorOptions quantile = o;
  quantile.dp_target_quantile = 1.0;
  EXPECT_THAT(error(quantile), HasSubstr("--dp_target_quantile"));
  quantile.dp_target_quantile = 0.5;
  quantile.dp_clipped_count_stddev = 0.5;  // = z / 2: no split exists
  EXPECT_THAT(error(quantile), HasSubstr("--dp_clipped_count_stddev"));
  quantile.dp_clipped_count_stddev = 0.6;
  EXPECT_TRUE(quantile.Validate().ok()) << quantile.Validate();
  CoordinatorOptions adaptive_only = clip_only;
  adaptive_only.dp_clip_norm = 0;
  adaptive_only.dp_target_quantile = 0.5;
  EXPECT_THAT(error(adaptive_only), HasSubstr("--dp_target_quantile"));

  CoordinatorOptions median = o;
  median.strategy = "fedmedian";
  auto refused = CoordinatorServer::Start(median, "127.0.0.1:0");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("fedmedian"));
}

}  // namespace
}  // namespace fedlearn
