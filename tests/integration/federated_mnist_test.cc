// A real federated run in one process: the coordinator on a loopback port and
// three agents training the seed's CNN with the C++ trainer on disjoint slices
// of the real MNIST digits of data/mnist (scripts/fetch-data.sh), for two
// rounds (or, in async mode, six applied updates) and an evaluation.

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/agent.h"
#include "client/cnn_trainer.h"
#include "client/idx.h"
#include "client/partition.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/run_controller.h"

namespace fedlearn {
namespace {

constexpr int kAgents = 3;
constexpr int64_t kTrainPerAgent = 400;
constexpr int64_t kTestPerAgent = 100;

class FederatedMnistTest : public ::testing::TestWithParam<Mode> {};

TEST_P(FederatedMnistTest, ThreeAgentsTrainAndAccuracyRises) {
  const bool async = GetParam() == Mode::kAsync;
  const std::string dir = absl::StrCat(FEDLEARN_SOURCE_DIR, "/data/mnist");
  absl::StatusOr<Dataset> train = LoadMnistDir(dir, /*train=*/true);
  absl::StatusOr<Dataset> test = LoadMnistDir(dir, /*train=*/false);
  if (!train.ok() || !test.ok()) {
    GTEST_SKIP() << "no data/mnist (run scripts/fetch-data.sh): "
                 << train.status();
  }
  auto scheme = ParsePartitionScheme("iid");
  ASSERT_TRUE(scheme.ok());
  auto train_parts = Partition(train->labels, *scheme, kAgents, /*seed=*/1);
  auto test_parts = Partition(test->labels, *scheme, kAgents, /*seed=*/1);
  ASSERT_TRUE(train_parts.ok() && test_parts.ok());

  CoordinatorOptions options;
  options.model = "mnist_cnn";
  options.min_clients = kAgents;
  options.clients_per_round = kAgents;
  options.mode = GetParam();
  // Rounds: two rounds of all three. Async: six updates, about two each.
  options.max_rounds = async ? 6 : 2;
  // Never converged: a window's mean loss can rise in async mode, and the
  // test counts on max_rounds ending the run.
  options.convergence_threshold = -std::numeric_limits<double>::infinity();
  options.rounds_between_validations = 1;
  options.round_timeout = absl::Minutes(5);
  auto server = CoordinatorServer::Start(options, "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  const std::vector<float> initial = *(*server)->controller().global_weights();

  // The agents' test slices, pooled, to compare the initial and final global
  // models.
  Dataset pooled_test;
  std::vector<int64_t> pooled_index;
  std::vector<std::unique_ptr<Agent>> agents;
  for (int i = 0; i < kAgents; ++i) {
    std::vector<int64_t> train_index = (*train_parts)[i];
    std::vector<int64_t> test_index = (*test_parts)[i];
    train_index.resize(std::min<size_t>(train_index.size(), kTrainPerAgent));
    test_index.resize(std::min<size_t>(test_index.size(), kTestPerAgent));
    pooled_index.insert(pooled_index.end(), test_index.begin(),
                        test_index.end());
    CnnTrainerOptions trainer;
    trainer.train = Subset(*train, train_index);
    trainer.test = Subset(*test, test_index);
    trainer.seed = 100 + i;
    AgentOptions agent_options;
    agent_options.coordinator = address;
    agent_options.display_name = absl::StrCat("agent-", i);
    agents.push_back(std::make_unique<Agent>(
        agent_options, [trainer](const v1::JoinResponse& joined) mutable {
          trainer.model = joined.model().name();
          SetInputNorm(joined.plan(), &trainer);
          return MakeCnnTrainer(std::move(trainer));
        }));
  }
  pooled_test = Subset(*test, pooled_index);

  std::vector<absl::StatusOr<AgentSummary>> results(kAgents);
  std::vector<std::thread> threads;
  for (int i = 0; i < kAgents; ++i) {
    threads.emplace_back([&, i] { results[i] = agents[i]->Run(); });
  }
  for (auto& t : threads) t.join();

  for (int i = 0; i < kAgents; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    if (!async) {
      EXPECT_EQ(results[i]->rounds_trained, 2);
    }
    EXPECT_TRUE(results[i]->evaluated);
  }
  const v1::GetStatusResponse status = (*server)->controller().GetStatus();
  ASSERT_EQ(status.phase(), v1::PHASE_DONE);
  EXPECT_EQ(status.stop_reason(), "max_rounds");
  const int training_records = options.max_rounds;
  ASSERT_EQ(status.history_size(), training_records + 1);
  EXPECT_TRUE(status.history(training_records).evaluation());
  if (async) {
    // Each applied update is a record; with three agents training at once,
    // most arrive after others were applied, and are scaled down.
    int stale = 0;
    for (int r = 0; r < training_records; ++r) {
      EXPECT_EQ(status.history(r).outcome(), "async");
      EXPECT_EQ(status.history(r).round(), r + 1);
      // Mixing 1 / min_clients, staleness exponent 0.5 (the defaults).
      EXPECT_NEAR(
          status.history(r).update_scale(),
          1.0 / kAgents / std::sqrt(1.0 + status.history(r).staleness()),
          1e-12);
      stale += status.history(r).staleness() > 0;
    }
    EXPECT_GT(stale, 0);
  } else {
    EXPECT_EQ(status.history(0).responded(), kAgents);
    EXPECT_EQ(status.history(1).responded(), kAgents);
    // Learning shows in the federated metrics...
    EXPECT_LT(status.history(1).metrics().train_loss(),
              status.history(0).metrics().train_loss());
    EXPECT_GT(status.history(1).metrics().validation_accuracy(), 0.5);
  }
  EXPECT_GT(status.final_evaluation().test_accuracy(), 0.75);
  EXPECT_EQ(status.final_evaluation().num_examples(), kAgents * kTestPerAgent);

  // ...and in the global model itself, judged on the same test digits.
  CnnTrainerOptions judge;
  judge.train = Subset(*train, std::vector<int64_t>{0});
  judge.test = pooled_test;
  v1::TrainingPlan plan;  // the coordinator's default standardisation
  plan.set_input_mean(static_cast<float>(options.input_mean));
  plan.set_input_std(static_cast<float>(options.input_std));
  SetInputNorm(plan, &judge);
  auto evaluator = MakeCnnTrainer(std::move(judge));
  ASSERT_TRUE(evaluator.ok());
  const auto before = (*evaluator)->Evaluate(initial);
  const auto after =
      (*evaluator)->Evaluate(*(*server)->controller().global_weights());
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_LT(before->accuracy, 0.3);  // an untrained model is near chance
  EXPECT_GT(after->accuracy, before->accuracy + 0.4);
  EXPECT_NEAR(after->accuracy, status.final_evaluation().test_accuracy(), 1e-9);
}

INSTANTIATE_TEST_SUITE_P(Modes, FederatedMnistTest,
                         ::testing::Values(Mode::kRounds, Mode::kAsync),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return info.param == Mode::kAsync ? "Async"
                                                             : "Rounds";
                         });

}  // namespace
}  // namespace fedlearn
