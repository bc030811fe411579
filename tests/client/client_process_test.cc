// The fedlearn-client binary as users run it: a real process against a real
// fedlearn-coordinator process, on a small synthetic data set written in
// MNIST's IDX format.

#include <signal.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/idx.h"
#include "common/model_spec.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/child_process.h"

namespace fedlearn {
namespace {

using ::fedlearn::testing::ChildProcess;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(30);

// Random 28x28 digits with labels 0..9 in turn: enough for the trainer to run.
Dataset Synthetic(int64_t n, uint32_t seed) {
  Dataset data;
  data.rows = 28;
  data.cols = 28;
  std::mt19937 rng(seed);
  data.pixels.resize(static_cast<size_t>(n * 28 * 28));
  for (uint8_t& p : data.pixels) p = static_cast<uint8_t>(rng() & 0xff);
  for (int64_t i = 0; i < n; ++i)
    data.labels.push_back(static_cast<uint8_t>(i % 10));
  return data;
}

int ListeningPort(ChildProcess& coordinator) {
  return fedlearn::testing::CoordinatorPort(coordinator, kTimeout);
}

class ClientProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string dir = ::testing::TempDir() + "fedlearn-client-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    data_dir_ = new std::string(dir);
    ASSERT_TRUE(WriteIdx(dir + "/train-images-idx3-ubyte",
                         dir + "/train-labels-idx1-ubyte", Synthetic(200, 1))
                    .ok());
    ASSERT_TRUE(WriteIdx(dir + "/t10k-images-idx3-ubyte",
                         dir + "/t10k-labels-idx1-ubyte", Synthetic(60, 2))
                    .ok());
  }

  static void TearDownTestSuite() {
    std::error_code ignored;
    std::filesystem::remove_all(*data_dir_, ignored);
    delete data_dir_;
    data_dir_ = nullptr;
  }

  static std::vector<std::string> Coordinator(std::vector<std::string> flags,
                                              int port = 0) {
    flags.insert(
        flags.begin(),
        {FEDLEARN_COORDINATOR_BINARY, "--bind=127.0.0.1", "--http_port=-1",
         absl::StrCat("--port=", port), "--model=mlp_2nn"});
    return flags;
  }

  static std::vector<std::string> Client(std::vector<std::string> flags,
                                         int port) {
    flags.insert(
        flags.begin(),
        {FEDLEARN_CLIENT_BINARY, absl::StrCat("--coordinator=127.0.0.1:", port),
         absl::StrCat("--data_dir=", *data_dir_), "--threads=1"});
    return flags;
  }

  static std::string* data_dir_;
};

std::string* ClientProcessTest::data_dir_ = nullptr;

TEST_F(ClientProcessTest, HelpListsEveryFlag) {
  ChildProcess help({FEDLEARN_CLIENT_BINARY, "--help"});
  ASSERT_TRUE(help.Wait(kTimeout).has_value());
  for (const char* flag :
       {"--coordinator", "--data_dir", "--partition", "--num_partitions",
        "--partition_index", "--agents", "--seed", "--join_token",
        "--max_backoff", "--name"}) {
    EXPECT_THAT(help.output(), HasSubstr(absl::StrCat(flag, " ("))) << flag;
  }
  EXPECT_THAT(help.output(), HasSubstr("default: \"localhost:50051\""));
}

TEST_F(ClientProcessTest, MissingDataDirIsAClearError) {
  ChildProcess client(
      {FEDLEARN_CLIENT_BINARY, "--data_dir=/nonexistent/fedlearn-digits"});
  EXPECT_EQ(client.Wait(kTimeout), 2);
  EXPECT_THAT(client.output(), HasSubstr("\"/nonexistent/fedlearn-digits\""));
}

TEST_F(ClientProcessTest, ConfigFileSetsOptionsAndFlagsWin) {
  const std::string config = testing::WriteTempFile(
      "client.textproto",
      "data_dir: \"/nonexistent/config-digits\"\nagents: 2\n");
  ASSERT_FALSE(config.empty());
  ChildProcess client({FEDLEARN_CLIENT_BINARY, "--config=" + config});
  EXPECT_EQ(client.Wait(kTimeout), 2);
  EXPECT_THAT(client.output(), HasSubstr("\"/nonexistent/config-digits\""));

  ChildProcess overridden({FEDLEARN_CLIENT_BINARY, "--config=" + config,
                           "--data_dir=/nonexistent/flag-digits"});
  EXPECT_EQ(overridden.Wait(kTimeout), 2);
  EXPECT_THAT(overridden.output(), HasSubstr("\"/nonexistent/flag-digits\""));
  EXPECT_THAT(overridden.output(),
              ::testing::Not(HasSubstr("/nonexistent/config-digits")));

  const std::string bad =
      testing::WriteTempFile("client.textproto", "agents: 2\nagent: 3\n");
  ChildProcess rejected({FEDLEARN_CLIENT_BINARY, "--config=" + bad});
  EXPECT_EQ(rejected.Wait(kTimeout), 2);
  EXPECT_THAT(rejected.output(),
              HasSubstr("client.textproto:2:6: Message type "
                        "\"fedlearn.v1.ClientConfig\" has no field named "
                        "\"agent\""));
}

TEST_F(ClientProcessTest, ConfigMessageHasAFieldForEveryFlag) {
  ChildProcess help({FEDLEARN_CLIENT_BINARY, "--help"});
  ASSERT_TRUE(help.Wait(kTimeout).has_value());
  ChildProcess schema({FEDLEARN_CLIENT_BINARY, "--config_schema"});
  ASSERT_EQ(schema.Wait(kTimeout), 0);
  EXPECT_THAT(testing::ConfigMismatches(help.output(), schema.output()),
              ::testing::IsEmpty());
  EXPECT_THAT(schema.output(), HasSubstr("message ClientConfig {"));
  EXPECT_THAT(schema.output(), HasSubstr("optional int32 agents = "));
  EXPECT_THAT(schema.output(), HasSubstr("optional bool tls = "));
}

TEST_F(ClientProcessTest, PartitionsBeyondNumPartitionsAreAClearError) {
  ChildProcess client(Client(
      {"--agents=2", "--num_partitions=2", "--partition_index=1"}, 50051));
  EXPECT_EQ(client.Wait(kTimeout), 2);
  EXPECT_THAT(client.output(), HasSubstr("--num_partitions is 2"));
}

TEST_F(ClientProcessTest, AgentsRunToDoneAndExitZero) {
  ChildProcess coordinator(
      Coordinator({"--min_clients=2", "--max_rounds=2", "--done_grace=20s"}));
  const int port = ListeningPort(coordinator);
  ASSERT_GT(port, 0) << coordinator.output();
  ChildProcess client(Client({"--agents=2", "--partition=shards"}, port));
  EXPECT_EQ(client.Wait(kTimeout), 0) << client.output();
  EXPECT_THAT(client.output(),
              HasSubstr("-p0 (client-"));  // the summary lines
  EXPECT_THAT(client.output(), HasSubstr("partition 0): done: 2 rounds"));
  EXPECT_THAT(client.output(), HasSubstr("partition 1): done: 2 rounds"));
  EXPECT_EQ(coordinator.Wait(kTimeout), 0) << coordinator.output();
}

// --model=PATH.safetensors serves any model; fedlearn-client trains only the
// registry's architectures and says so at Join.
TEST_F(ClientProcessTest, AModelItCannotTrainIsRefusedAtJoin) {
  absl::StatusOr<ModelSpec> mine =
      MakeModelSpec("mine", {{"encoder.weight", {16, 784}, Init::kZeros},
                             {"head.bias", {10}, Init::kZeros}});
  ASSERT_TRUE(mine.ok());
  const std::string path = *data_dir_ + "/mine.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, *mine,
                               std::vector<float>(mine->num_parameters, 0.5f))
                  .ok());
  ChildProcess coordinator(
      Coordinator({"--model=" + path, "--min_clients=1", "--max_rounds=1"}));
  const int port = ListeningPort(coordinator);
  ASSERT_GT(port, 0) << coordinator.output();
  ChildProcess client(Client({}, port));
  const std::optional<int> code = client.Wait(kTimeout);
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 0);
  EXPECT_THAT(client.output(),
              HasSubstr("serves model \"mine\" (2 tensors, 12554 parameters), "
                        "which fedlearn-client cannot train"));
  EXPECT_THAT(client.output(), HasSubstr("Python SDK"));
}

// A model fedlearn saved keeps its registry name: agents go on training it.
TEST_F(ClientProcessTest, ASavedRegistryModelTrainsAsThatModel) {
  absl::StatusOr<ModelSpec> mlp = LookupModel("mlp_2nn");
  ASSERT_TRUE(mlp.ok());
  std::vector<float> weights(mlp->num_parameters);
  InitializeParameters(*mlp, 5, absl::MakeSpan(weights));
  const std::string path = *data_dir_ + "/model-000003.safetensors";
  ASSERT_TRUE(
      WriteSafetensors(path, *mlp, weights, {{"model", "mlp_2nn"}}).ok());
  ChildProcess coordinator(Coordinator({"--model=" + path, "--min_clients=1",
                                        "--max_rounds=1", "--done_grace=20s"}));
  const int port = ListeningPort(coordinator);
  ASSERT_GT(port, 0) << coordinator.output();
  ChildProcess client(Client({}, port));
  EXPECT_EQ(client.Wait(kTimeout), 0) << client.output();
  EXPECT_EQ(coordinator.Wait(kTimeout), 0) << coordinator.output();
}

TEST_F(ClientProcessTest, AMalformedModelFileStopsTheCoordinatorWithExit2) {
  const std::string path = *data_dir_ + "/broken.safetensors";
  std::ofstream(path) << "not a safetensors file";
  ChildProcess coordinator(Coordinator({"--model=" + path}));
  EXPECT_EQ(coordinator.Wait(kTimeout), 2) << coordinator.output();
  EXPECT_THAT(coordinator.output(), HasSubstr("--model: " + path));
}

TEST_F(ClientProcessTest, Int8UpdatesRunToDoneWithAQuarterOfTheUpload) {
  ChildProcess coordinator(
      Coordinator({"--min_clients=2", "--max_rounds=2", "--done_grace=20s"}));
  const int port = ListeningPort(coordinator);
  ASSERT_GT(port, 0) << coordinator.output();
  ChildProcess client(Client({"--agents=2", "--update_encoding=int8"}, port));
  EXPECT_EQ(client.Wait(kTimeout), 0) << client.output();
  EXPECT_EQ(coordinator.Wait(kTimeout), 0) << coordinator.output();
  EXPECT_THAT(client.output(), HasSubstr("partition 0): done: 2 rounds"));
  // mlp_2nn: 199,210 parameters in 6 tensors, so an update is 199,234 bytes
  // instead of 796,840; four of them (0.8 MB, against 3.2 MB dense).
  EXPECT_THAT(coordinator.output(), HasSubstr("0.8 MB received"));
  EXPECT_THAT(client.output(), HasSubstr("sent 0.20 MB"));
}

TEST_F(ClientProcessTest, UnknownUpdateEncodingIsAUsageError) {
  ChildProcess client(Client({"--update_encoding=int4"}, 50051));
  EXPECT_EQ(client.Wait(kTimeout), 2);
  EXPECT_THAT(client.output(), HasSubstr("--update_encoding"));
}

TEST_F(ClientProcessTest, AgentsRunAnAsyncModeRunToDone) {
  // Four updates on 90 digits each can look converged (a window's mean loss
  // may rise): only max_rounds may end this run.
  ChildProcess coordinator(
      Coordinator({"--mode=async", "--min_clients=2", "--max_rounds=6",
                   "--convergence_threshold=-inf", "--done_grace=20s"}));
  const int port = ListeningPort(coordinator);
  ASSERT_GT(port, 0) << coordinator.output();
  ChildProcess client(Client({"--agents=2"}, port));
  EXPECT_EQ(client.Wait(kTimeout), 0) << client.output();
  EXPECT_EQ(coordinator.Wait(kTimeout), 0) << coordinator.output();
  EXPECT_THAT(coordinator.output(), HasSubstr("async training started"));
  EXPECT_THAT(coordinator.output(), HasSubstr("round 6: update from"));
  EXPECT_THAT(coordinator.output(),
              HasSubstr("run done: 6 rounds (max_rounds)"));
}

TEST_F(ClientProcessTest, ReconnectsToARestartedCoordinator) {
  std::optional<ChildProcess> coordinator;
  coordinator.emplace(Coordinator({"--min_clients=3"}));  // never starts
  const int port = ListeningPort(*coordinator);
  ASSERT_GT(port, 0) << coordinator->output();
  ChildProcess client(Client({"--agents=2", "--max_backoff=200ms"}, port));
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(client.WaitForLine("joined", kTimeout).has_value())
        << client.output();
  }
  coordinator->Signal(SIGTERM);
  ASSERT_EQ(coordinator->Wait(kTimeout), 0) << coordinator->output();
  // Nothing listens now; the agents keep trying.
  ASSERT_TRUE(client.WaitForLine("Connection refused", kTimeout).has_value())
      << client.output();

  // A new coordinator on the same port knows nothing of the agents: they join
  // again and finish its run.
  coordinator.reset();
  coordinator.emplace(Coordinator(
      {"--min_clients=2", "--max_rounds=1", "--done_grace=20s"}, port));
  ASSERT_EQ(ListeningPort(*coordinator), port) << coordinator->output();
  const absl::Time restarted = absl::Now();
  ASSERT_TRUE(client.WaitForLine("joining again", kTimeout).has_value())
      << client.output();
  // The agents drive their channel's reconnection while they back off; left to
  // itself, gRPC's synchronous client would notice the coordinator only at its
  // 5s backup poll.
  EXPECT_LT(absl::Now() - restarted, absl::Seconds(3));
  EXPECT_EQ(client.Wait(kTimeout), 0) << client.output();
  EXPECT_THAT(client.output(), HasSubstr("done: 1 rounds trained"));
  EXPECT_THAT(client.output(), HasSubstr("2 join(s)"));
  EXPECT_EQ(coordinator->Wait(kTimeout), 0) << coordinator->output();
}

TEST_F(ClientProcessTest, SignalsStopTheAgents) {
  ChildProcess coordinator(Coordinator({"--min_clients=10"}));  // never starts
  const int port = ListeningPort(coordinator);
  ASSERT_GT(port, 0) << coordinator.output();
  for (const int signal : {SIGINT, SIGTERM}) {
    ChildProcess client(Client({"--agents=2"}, port));
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(client.WaitForLine("joined", kTimeout).has_value())
          << client.output();
    }
    // Both agents are in a long poll now, or about to be.
    client.Signal(signal);
    EXPECT_EQ(client.Wait(absl::Seconds(5)), signal == SIGINT ? 130 : 0)
        << client.output();
    EXPECT_THAT(client.output(), HasSubstr("(partition 0): stopped"));
    EXPECT_THAT(client.output(), HasSubstr("(partition 1): stopped"));
  }
}

// With --agents=N, an agent that fails says so when it fails, not in the
// summary after the others are done (which may be hours later); and a signal
// later does not turn that failure into exit 0.
TEST_F(ClientProcessTest, AnAgentThatFailsSaysSoAtOnceAndTheExitStatusKeepsIt) {
  // Room for one client, and a run that never starts.
  ChildProcess coordinator(
      Coordinator({"--min_clients=10", "--max_clients=1"}));
  const int port = ListeningPort(coordinator);
  ASSERT_GT(port, 0) << coordinator.output();
  // The second agent's join is refused until --reconnect_timeout, then it
  // fails.
  ChildProcess client(Client(
      {"--agents=2", "--max_backoff=100ms", "--reconnect_timeout=1s"}, port));
  ASSERT_TRUE(
      client.WaitForLine("the other agents go on", kTimeout).has_value())
      << client.output();
  EXPECT_THAT(client.output(), HasSubstr("refused the join for 1"));
  client.Signal(SIGTERM);
  EXPECT_EQ(client.Wait(absl::Seconds(5)), 1) << client.output();
  EXPECT_THAT(client.output(), HasSubstr(": stopped"));  // the other one
}

TEST_F(ClientProcessTest, ReadmeDocumentsEveryFlag) {
  ChildProcess help({FEDLEARN_CLIENT_BINARY, "--help"});
  ASSERT_TRUE(help.Wait(absl::Seconds(20)).has_value());
  const std::string readme = fedlearn::testing::ReadFile(
      absl::StrCat(FEDLEARN_SOURCE_DIR, "/README.md"));
  ASSERT_FALSE(readme.empty());
  const std::vector<std::string> flags =
      fedlearn::testing::FlagsInHelp(help.output());
  EXPECT_GE(flags.size(), 10u);
  for (const std::string& flag : flags) {
    EXPECT_THAT(readme, ::testing::HasSubstr(absl::StrCat("| `", flag, "` |")))
        << flag << " is missing from the README's client flag table";
  }
}

}  // namespace
}  // namespace fedlearn
