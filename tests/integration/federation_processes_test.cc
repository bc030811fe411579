// The whole system as users run it: fedlearn-coordinator and five
// fedlearn-client processes over localhost, on a slice of the real digits of
// data/mnist. One agent is killed in the middle of round 2; the round still
// closes at quorum, the run goes on through round 3 and the evaluation phase to
// DONE, and every process exits. Then agents that keep crashing, and a
// coordinator that does.

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/idx.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/child_process.h"

namespace fedlearn {
namespace {

using ::fedlearn::testing::ChildProcess;
using ::testing::HasSubstr;

constexpr int kAgents = 5;
constexpr int64_t kTrainPerAgent = 240;
constexpr int64_t kTestPerAgent = 60;
constexpr absl::Duration kTimeout = absl::Seconds(120);

// Train accuracy of `round` from the coordinator's "round N: closed ...
// accuracy A" line.
double ClosedRoundAccuracy(const std::string& log, int round) {
  const std::string prefix = absl::StrCat("round ", round, ": closed");
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (line.find(prefix) == absl::string_view::npos) continue;
    const size_t at = line.find(" accuracy ");
    double accuracy = -1;
    if (at != absl::string_view::npos &&
        absl::SimpleAtod(
            line.substr(at + 10, line.find_first_of(",\n", at + 10) - at - 10),
            &accuracy)) {
      return accuracy;
    }
  }
  return -1;
}

// Writes a slice of data/mnist's real digits into a fresh directory (so that
// a round takes seconds) and returns it; empty when data/mnist is missing.
std::filesystem::path WriteSlice(const std::string& name,
                                 int agents = kAgents) {
  const std::string source = absl::StrCat(FEDLEARN_SOURCE_DIR, "/data/mnist");
  absl::StatusOr<Dataset> train = LoadMnistDir(source, /*train=*/true);
  absl::StatusOr<Dataset> test = LoadMnistDir(source, /*train=*/false);
  if (!train.ok() || !test.ok()) return {};
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      absl::StrCat(name, "_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<int64_t> train_index(agents * kTrainPerAgent),
      test_index(agents * kTestPerAgent);
  for (size_t i = 0; i < train_index.size(); ++i)
    train_index[i] = static_cast<int64_t>(i);
  for (size_t i = 0; i < test_index.size(); ++i)
    test_index[i] = static_cast<int64_t>(i);
  EXPECT_TRUE(WriteIdx((dir / "train-images-idx3-ubyte").string(),
                       (dir / "train-labels-idx1-ubyte").string(),
                       Subset(*train, train_index))
                  .ok());
  EXPECT_TRUE(WriteIdx((dir / "t10k-images-idx3-ubyte").string(),
                       (dir / "t10k-labels-idx1-ubyte").string(),
                       Subset(*test, test_index))
                  .ok());
  return dir;
}

std::unique_ptr<ChildProcess> StartAgent(int port,
                                         const std::filesystem::path& data,
                                         int index, int agents = kAgents,
                                         std::vector<std::string> more = {}) {
  std::vector<std::string> argv = {
      FEDLEARN_CLIENT_BINARY,
      absl::StrCat("--coordinator=127.0.0.1:", port),
      absl::StrCat("--data_dir=", data.string()),
      "--partition=iid",
      absl::StrCat("--num_partitions=", agents),
      absl::StrCat("--partition_index=", index),
      "--threads=1",
      absl::StrCat("--name=agent", index)};
  argv.insert(argv.end(), more.begin(), more.end());
  return std::make_unique<ChildProcess>(argv);
}

TEST(FederationProcessesTest, AgentKilledMidRoundAndTheRunStillFinishes) {
  const std::filesystem::path dir = WriteSlice("federation");
  if (dir.empty()) GTEST_SKIP() << "no data/mnist (run scripts/fetch-data.sh)";

  ChildProcess coordinator(
      {FEDLEARN_COORDINATOR_BINARY, "--port=0", "--bind=127.0.0.1",
       "--http_port=0", "--model=mnist_cnn", "--min_clients=5",
       "--clients_per_round=5", "--max_rounds=3",
       "--convergence_threshold=-inf", "--rounds_between_validations=1",
       "--round_timeout=90s", "--eval_timeout=90s", "--done_grace=5s",
       // Round 3 needs --min_clients alive, and the killed agent counts until
       // it has been silent for --client_timeout (default 20 s): a round 2
       // slower than that on a loaded machine would leave the run waiting for
       // a fifth client forever. The run itself is what this test checks.
       "--client_timeout=10m"});
  const int port = testing::CoordinatorPort(coordinator, kTimeout);
  ASSERT_GT(port, 0) << coordinator.output();

  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < kAgents; ++i) {
    agents.push_back(StartAgent(port, dir, i));
    ASSERT_TRUE(agents.back()->started());
  }

  // Kill one agent as soon as round 2 has started: it never answers round 2.
  ASSERT_TRUE(
      coordinator.WaitForLine("round 2: training attempt 1 started", kTimeout))
      << coordinator.output();
  agents.back()->Signal(SIGKILL);
  EXPECT_EQ(agents.back()->Wait(kTimeout), 128 + SIGKILL);

  // The coordinator exits by itself once the run is DONE and the live agents
  // were told.
  const std::optional<int> coordinator_exit = coordinator.Wait(kTimeout);
  ASSERT_TRUE(coordinator_exit.has_value()) << "coordinator still running:\n"
                                            << coordinator.output();
  EXPECT_EQ(*coordinator_exit, 0) << coordinator.output();
  for (int i = 0; i + 1 < kAgents; ++i) {
    const std::optional<int> exit_code = agents[i]->Wait(kTimeout);
    ASSERT_TRUE(exit_code.has_value()) << "agent " << i << " still running";
    EXPECT_EQ(*exit_code, 0) << agents[i]->output();
  }

  const std::string& log = coordinator.output();
  // Every phase was reached, in order.
  const size_t waiting = log.find("waiting for 5 clients");
  const size_t training = log.find("round 1: training attempt 1 started");
  const size_t evaluating = log.find("evaluation attempt 1 started");
  const size_t done = log.find("run done: 3 rounds (max_rounds)");
  ASSERT_NE(waiting, std::string::npos) << log;
  ASSERT_NE(training, std::string::npos) << log;
  ASSERT_NE(evaluating, std::string::npos) << log;
  ASSERT_NE(done, std::string::npos) << log;
  EXPECT_LT(waiting, training);
  EXPECT_LT(training, evaluating);
  EXPECT_LT(evaluating, done);
  // Round 2 closed at quorum (4 of 5) without its killed agent, not at its
  // deadline.
  EXPECT_THAT(log, HasSubstr("round 2: closed (quorum) with 4 of 5 updates"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("abandoned")));
  // The model learned: train accuracy rose from round 1 to round 3.
  const double first = ClosedRoundAccuracy(log, 1);
  const double last = ClosedRoundAccuracy(log, 3);
  ASSERT_GE(first, 0) << log;
  EXPECT_GT(last, first + 0.2) << log;
  std::filesystem::remove_all(dir);
}

// Crashing agents, as a fleet on preemptible machines has them: ten agents,
// ten per round, the round rules' defaults (tolerance 0.3, client timeout
// 20 s). In each of rounds 1 to 3, three agents are SIGKILLed mid-round and
// restarted a second later, under new ids but with the session files they
// keep (--session_dir). Each restart retires its dead identity at once (and
// takes its place if its round is still open), so no round samples the dead
// or waits for them: every round closes at quorum or with all, none is
// abandoned. (A --round_timeout of 60 s rather than 5 min only makes a round
// that did wait for the dead fail the test sooner.)
TEST(FederationProcessesTest,
     AgentsKilledEveryRoundAndRestartedNeverHoldARound) {
  constexpr int kFleet = 10;
  constexpr int kKilledPerRound = 3;
  constexpr int kRounds = 4;
  const std::filesystem::path dir = WriteSlice("churn", kFleet);
  if (dir.empty()) GTEST_SKIP() << "no data/mnist (run scripts/fetch-data.sh)";
  const std::string sessions =
      absl::StrCat("--session_dir=", (dir / "sessions").string());

  ChildProcess coordinator(
      {FEDLEARN_COORDINATOR_BINARY, "--port=0", "--bind=127.0.0.1",
       "--http_port=-1", "--model=mnist_cnn",
       absl::StrCat("--min_clients=", kFleet),
       absl::StrCat("--clients_per_round=", kFleet),
       absl::StrCat("--max_rounds=", kRounds), "--convergence_threshold=-inf",
       "--round_timeout=60s", "--eval_timeout=60s", "--done_grace=5s"});
  const int port = testing::CoordinatorPort(coordinator, kTimeout);
  ASSERT_GT(port, 0) << coordinator.output();
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < kFleet; ++i) {
    agents.push_back(StartAgent(port, dir, i, kFleet, {sessions}));
    ASSERT_TRUE(agents.back()->started());
  }

  for (int round = 1; round < kRounds; ++round) {
    ASSERT_TRUE(coordinator.WaitForLine(
        absl::StrCat("round ", round, ": training attempt 1 started"),
        kTimeout))
        << coordinator.output();
    absl::SleepFor(absl::Milliseconds(300));  // into the download and training
    std::vector<int> killed;
    for (int k = 0; k < kKilledPerRound; ++k) {
      killed.push_back((round * kKilledPerRound + k) % kFleet);
    }
    for (int i : killed) agents[i]->Signal(SIGKILL);
    for (int i : killed) EXPECT_EQ(agents[i]->Wait(kTimeout), 128 + SIGKILL);
    absl::SleepFor(absl::Seconds(1));
    for (int i : killed) {
      agents[i] = StartAgent(port, dir, i, kFleet, {sessions});
      ASSERT_TRUE(agents[i]->started());
    }
  }

  const std::optional<int> coordinator_exit = coordinator.Wait(kTimeout);
  ASSERT_TRUE(coordinator_exit.has_value()) << "coordinator still running:\n"
                                            << coordinator.output();
  EXPECT_EQ(*coordinator_exit, 0) << coordinator.output();
  for (int i = 0; i < kFleet; ++i) {
    const std::optional<int> exit_code = agents[i]->Wait(kTimeout);
    ASSERT_TRUE(exit_code.has_value()) << "agent " << i << " still running";
    EXPECT_EQ(*exit_code, 0) << agents[i]->output();
  }
  const std::string& log = coordinator.output();
  EXPECT_THAT(log, ::testing::Not(HasSubstr("abandoned"))) << log;
  for (int round = 1; round <= kRounds; ++round) {
    EXPECT_THAT(log, ::testing::ContainsRegex(absl::StrCat(
                         "round ", round, ": closed \\((quorum|all)\\)")))
        << log;
  }
  // Every restart retired the identity its process had before.
  int retired = 0;
  for (size_t at = log.find(" retired: it joined again as ");
       at != std::string::npos;
       at = log.find(" retired: it joined again as ", at + 1)) {
    ++retired;
  }
  EXPECT_EQ(retired, (kRounds - 1) * kKilledPerRound) << log;
  EXPECT_THAT(log, HasSubstr(absl::StrCat("run done: ", kRounds,
                                          " rounds (max_rounds)")));
  std::filesystem::remove_all(dir);
}

// The coordinator is killed (SIGKILL: no chance to clean up) after round 2
// closed. Restarted on the same --state_dir and port, it resumes the run where
// its last save left it; the agents, never restarted, reconnect and join again
// by themselves, and the run finishes its 4 rounds and evaluation.
TEST(FederationProcessesTest, CoordinatorKilledMidRunResumesFromItsStateDir) {
  const std::filesystem::path dir = WriteSlice("resume");
  if (dir.empty()) GTEST_SKIP() << "no data/mnist (run scripts/fetch-data.sh)";
  const std::string state_dir = (dir / "state").string();
  constexpr int kResumeAgents = 3;
  auto coordinator_flags = [&](int port) {
    return std::vector<std::string>{
        FEDLEARN_COORDINATOR_BINARY,
        absl::StrCat("--port=", port),
        "--bind=127.0.0.1",
        "--http_port=-1",
        "--model=mnist_cnn",
        absl::StrCat("--min_clients=", kResumeAgents),
        "--max_rounds=4",
        "--convergence_threshold=-inf",
        "--rounds_between_validations=2",
        "--round_timeout=90s",
        "--eval_timeout=90s",
        "--done_grace=5s",
        absl::StrCat("--state_dir=", state_dir)};
  };
  auto first = std::make_unique<ChildProcess>(coordinator_flags(0));
  const int port = testing::CoordinatorPort(*first, kTimeout);
  ASSERT_GT(port, 0) << first->output();
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < kResumeAgents; ++i) {
    agents.push_back(StartAgent(port, dir, i));
    ASSERT_TRUE(agents.back()->started());
  }
  ASSERT_TRUE(first->WaitForLine("round 2: closed", kTimeout))
      << first->output();
  const std::string run_id = [&] {
    const std::string& log = first->output();
    const size_t at = log.find("run ");
    return log.substr(at + 4, log.find(':', at) - at - 4);
  }();
  first->Signal(SIGKILL);
  EXPECT_EQ(first->Wait(kTimeout), 128 + SIGKILL);
  EXPECT_TRUE(std::filesystem::exists(state_dir + "/state.binpb"));

  ChildProcess second(coordinator_flags(port));
  ASSERT_TRUE(second.WaitForLine("resumed from", kTimeout)) << second.output();
  const std::optional<int> exit_code = second.Wait(kTimeout);
  ASSERT_TRUE(exit_code.has_value()) << "coordinator still running:\n"
                                     << second.output();
  EXPECT_EQ(*exit_code, 0) << second.output();
  for (auto& agent : agents) {
    const std::optional<int> agent_exit = agent->Wait(kTimeout);
    ASSERT_TRUE(agent_exit.has_value()) << "agent still running";
    EXPECT_EQ(*agent_exit, 0) << agent->output();
  }
  const std::string& log = second.output();
  // The same run, resumed after round 1 or 2 (whichever save the kill left
  // whole), not started over.
  EXPECT_THAT(log, HasSubstr(absl::StrCat("run ", run_id, " resumed from")));
  EXPECT_THAT(log, ::testing::ContainsRegex(
                       "resumed from .*: PHASE_WAITING_FOR_CLIENTS at round "
                       "[23] \\([12] rounds folded"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("round 1: training attempt")));
  EXPECT_THAT(log, HasSubstr("round 4: closed"));
  EXPECT_THAT(log, HasSubstr("run done: 4 rounds (max_rounds)"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fedlearn
