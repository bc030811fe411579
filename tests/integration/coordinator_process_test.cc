// The fedlearn-coordinator binary as users run it: a real process on a real
// port.

#include <grpcpp/create_channel.h>
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "common/model_spec.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/child_process.h"

namespace fedlearn {
namespace {

using ::fedlearn::testing::ChildProcess;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(20);

int StartCoordinator(ChildProcess& process) {
  return testing::CoordinatorPort(process, kTimeout);
}

std::vector<std::string> Command(std::vector<std::string> flags) {
  flags.insert(flags.begin(), {FEDLEARN_COORDINATOR_BINARY, "--port=0",
                               "--bind=127.0.0.1", "--http_port=0"});
  return flags;
}

std::unique_ptr<CoordinatorClient> Connect(int port) {
  return std::make_unique<CoordinatorClient>(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
}

TEST(CoordinatorProcessTest, SigtermShutsDownGracefully) {
  ChildProcess coordinator(Command({"--model=mlp_2nn", "--min_clients=5"}));
  ASSERT_TRUE(coordinator.started());
  const int port = StartCoordinator(coordinator);
  ASSERT_GT(port, 0) << coordinator.output();
  auto client = Connect(port);
  ASSERT_TRUE(client->Join(v1::JoinRequest()).ok());
  // A poll held open (not enough clients to start) is answered UNAVAILABLE at
  // shutdown.
  absl::StatusOr<CoordinatorClient::ReceivedTask> poll;
  std::thread poller([&] { poll = client->RequestUpdate(absl::Seconds(15)); });
  auto observer = Connect(port);
  const absl::Time deadline = absl::Now() + kTimeout;
  bool held = false;
  while (!held && absl::Now() < deadline) {
    auto status = observer->GetStatus();
    held = status.ok() && status->clients_size() == 1 &&
           status->clients(0).polling();
  }
  coordinator.Signal(SIGTERM);
  const std::optional<int> exit_code = coordinator.Wait(kTimeout);
  poller.join();
  ASSERT_TRUE(held) << "the poll was never held open";
  ASSERT_TRUE(exit_code.has_value()) << "still running after SIGTERM";
  EXPECT_EQ(*exit_code, 0) << coordinator.output();
  EXPECT_EQ(poll.status().code(), absl::StatusCode::kUnavailable)
      << poll.status();
  EXPECT_THAT(coordinator.output(), HasSubstr("shutting down"));
  EXPECT_THAT(coordinator.output(), HasSubstr("stopped; peak RSS"));
}

// A log collector that stops reading the coordinator's stderr (a full pipe)
// holds up no client: the run logs under its lock, but a thread of its own
// writes the lines, and what does not fit its queue is dropped and counted.
TEST(CoordinatorProcessTest, AStalledLogReaderHoldsUpNoClient) {
  ChildProcess coordinator(Command(
      {"--model=mlp_2nn", "--min_clients=100000", "--max_clients=100000"}));
  ASSERT_TRUE(coordinator.started());
  const int port = StartCoordinator(coordinator);
  ASSERT_GT(port, 0) << coordinator.output();
  // From here nothing reads the pipe until the joins are done. A join logs
  // about 90 bytes: 3,000 are four times what the pipe (64 KiB) holds.
  constexpr int kJoins = 3000;
  auto client = std::make_unique<CoordinatorClient>(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                          grpc::InsecureChannelCredentials()),
      kDefaultPushChunkBytes, absl::Seconds(5));
  int joined = 0;
  absl::Status failed;
  for (int i = 0; i < kJoins && failed.ok(); ++i) {
    v1::JoinRequest request;
    request.set_display_name(absl::StrCat("joiner-", i));
    absl::Status s = client->Join(request).status();
    if (s.ok()) {
      ++joined;
    } else {
      failed = s;
    }
  }
  EXPECT_EQ(joined, kJoins) << "join " << joined + 1 << ": " << failed;
  // Reading again, the log catches up: the last join's line, or the count of
  // those dropped while the pipe was full.
  const std::optional<std::string> caught_up = coordinator.WaitForLine(
      absl::StrCat("joiner-", kJoins - 1), absl::Seconds(10));
  if (!caught_up.has_value()) {
    EXPECT_THAT(coordinator.output(), HasSubstr("log lines dropped"));
  }
  coordinator.Signal(SIGTERM);
  const std::optional<int> exit_code = coordinator.Wait(kTimeout);
  ASSERT_TRUE(exit_code.has_value()) << "still running after SIGTERM";
  EXPECT_EQ(*exit_code, 0);
  EXPECT_THAT(coordinator.output(), HasSubstr("stopped; peak RSS"));
}

// One scripted client trains rounds up to `last` (inclusive) on the
// coordinator at `port`: its update depends on the weights it was sent
// (0.01 - 0.1 w), so every round's model depends on every earlier one.
void TrainThrough(int port, int64_t last) {
  auto client = Connect(port);
  ASSERT_TRUE(client->Join(v1::JoinRequest()).ok());
  for (int polls = 0; polls < 50; ++polls) {
    auto task = client->RequestUpdate(absl::Seconds(5));
    ASSERT_TRUE(task.ok()) << task.status();
    if (task->task.type() != v1::TASK_TYPE_TRAIN) continue;
    v1::UpdateHeader header;
    header.set_round(task->task.round());
    header.set_num_examples(10);
    header.set_train_loss(1.0);
    std::vector<float> delta(task->weights.size());
    for (size_t i = 0; i < delta.size(); ++i) {
      delta[i] = 0.01f - 0.1f * task->weights[i];
    }
    ASSERT_TRUE(client->PushUpdate(header, delta).ok());
    // The push's reply comes after the round's save.
    if (task->task.round() == last) return;
  }
  FAIL() << "no TRAIN for round " << last;
}

// A FedYogi run SIGKILLed after round 2 and restarted on its state directory
// makes the same round-4 model, bit for bit, as a run never interrupted.
TEST(CoordinatorProcessTest, KilledAndResumedRunMatchesTheUninterruptedOne) {
  const std::string root = ::testing::TempDir() + "fedlearn-resume-XXXXXX";
  std::string dir = root;
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  auto command = [&dir](const std::string& state) {
    return Command({"--model=mlp_2nn", "--min_clients=1",
                    "--clients_per_round=1", "--max_rounds=4",
                    "--convergence_threshold=-inf", "--strategy=fedyogi",
                    "--strategy_config=server_learning_rate: 0.05",
                    "--state_dir=" + dir + "/" + state});
  };
  auto final_model = [&dir](const std::string& state) {
    auto weights =
        ReadSafetensors(dir + "/" + state + "/model-000004.safetensors",
                        *LookupModel("mlp_2nn"));
    EXPECT_TRUE(weights.ok()) << weights.status();
    return weights.ok() ? *weights : std::vector<float>();
  };
  {
    ChildProcess whole(command("whole"));
    const int port = StartCoordinator(whole);
    ASSERT_GT(port, 0) << whole.output();
    TrainThrough(port, 4);
    whole.Signal(SIGKILL);
  }
  {
    ChildProcess first(command("split"));
    const int port = StartCoordinator(first);
    ASSERT_GT(port, 0) << first.output();
    TrainThrough(port, 2);
    first.Signal(SIGKILL);
    first.Wait(kTimeout);
  }
  ChildProcess resumed(command("split"));
  const int port = StartCoordinator(resumed);
  ASSERT_GT(port, 0) << resumed.output();
  EXPECT_THAT(resumed.output(), HasSubstr("at round 3 (2 rounds folded"));
  TrainThrough(port, 4);
  resumed.Signal(SIGKILL);
  const std::vector<float> straight = final_model("whole");
  ASSERT_FALSE(straight.empty());
  EXPECT_EQ(final_model("split"), straight);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

// One client joins the coordinator at `port` and takes its tasks (trains,
// evaluates) until it is told DONE; returns whether it was.
bool RunToDone(int port) {
  auto client = Connect(port);
  if (!client->Join(v1::JoinRequest()).ok()) return false;
  bool done = false;
  for (int polls = 0; polls < 10 && !done; ++polls) {
    auto task = client->RequestUpdate(absl::Seconds(5));
    if (!task.ok()) {
      ADD_FAILURE() << task.status();
      return false;
    }
    switch (task->task.type()) {
      case v1::TASK_TYPE_TRAIN: {
        v1::UpdateHeader header;
        header.set_round(task->task.round());
        header.set_num_examples(10);
        header.set_train_loss(1.0);
        std::vector<float> delta(task->weights.size(), 0.001f);
        EXPECT_TRUE(client->PushUpdate(header, delta).ok());
        break;
      }
      case v1::TASK_TYPE_EVALUATE: {
        v1::ReportEvalRequest report;
        report.set_round(task->task.round());
        report.set_test_accuracy(0.5);
        report.set_num_examples(10);
        EXPECT_TRUE(client->ReportEval(report).ok());
        break;
      }
      case v1::TASK_TYPE_DONE:
        done = true;
        break;
      default:
        break;
    }
  }
  return done;
}

TEST(CoordinatorProcessTest, ExitsByItselfOnceTheRunIsDone) {
  ChildProcess coordinator(Command({"--model=mlp_2nn", "--min_clients=1",
                                    "--max_rounds=1", "--done_grace=20s"}));
  const int port = StartCoordinator(coordinator);
  ASSERT_GT(port, 0) << coordinator.output();
  ASSERT_TRUE(RunToDone(port));
  const std::optional<int> exit_code = coordinator.Wait(kTimeout);
  ASSERT_TRUE(exit_code.has_value()) << "still running after DONE";
  EXPECT_EQ(*exit_code, 0) << coordinator.output();
  EXPECT_THAT(coordinator.output(),
              HasSubstr("run done: 1 rounds (max_rounds)"));
}

// A coordinator resumed on a run that was already DONE knows none of its
// clients, yet an agent that missed DONE to the crash comes back within its
// backoff: it serves --done_grace, telling each one DONE, before it exits.
// (Before, it exited 0.2 s after its start, and such an agent retried into
// nothing until its reconnect_timeout, then failed.)
TEST(CoordinatorProcessTest, AResumedFinishedRunTellsComersDoneForItsGrace) {
  const std::string root = ::testing::TempDir() + "fedlearn-done-XXXXXX";
  std::string dir = root;
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::vector<std::string> command =
      Command({"--model=mlp_2nn", "--min_clients=1", "--max_rounds=1",
               "--done_grace=4s", "--state_dir=" + dir + "/state"});
  {
    ChildProcess first(command);
    const int port = StartCoordinator(first);
    ASSERT_GT(port, 0) << first.output();
    ASSERT_TRUE(RunToDone(port));
    ASSERT_EQ(first.Wait(kTimeout), std::optional<int>(0)) << first.output();
  }
  ChildProcess resumed(command);
  const int port = StartCoordinator(resumed);
  ASSERT_GT(port, 0) << resumed.output();
  absl::SleepFor(absl::Seconds(1));  // an agent backing off
  auto client = Connect(port);
  ASSERT_TRUE(client->Join(v1::JoinRequest()).ok()) << resumed.output();
  auto task = client->RequestUpdate(absl::Seconds(5));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->task.type(), v1::TASK_TYPE_DONE);
  EXPECT_EQ(resumed.Wait(kTimeout), std::optional<int>(0)) << resumed.output();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST(CoordinatorProcessTest, BadFlagValueIsAClearError) {
  ChildProcess coordinator(Command({"--tolerance=1.5"}));
  const std::optional<int> exit_code = coordinator.Wait(kTimeout);
  ASSERT_TRUE(exit_code.has_value());
  EXPECT_EQ(*exit_code, 2);
  EXPECT_THAT(coordinator.output(),
              HasSubstr("--tolerance: must be in [0, 1)"));

  ChildProcess unknown_model(Command({"--model=resnet"}));
  EXPECT_EQ(unknown_model.Wait(kTimeout), 2);
  EXPECT_THAT(unknown_model.output(), HasSubstr("unknown model \"resnet\""));

  ChildProcess no_cert(Command(
      {"--tls_cert=/no/such/server.pem", "--tls_key=/no/such/server.key"}));
  EXPECT_EQ(no_cert.Wait(kTimeout), 2);
  EXPECT_THAT(no_cert.output(), HasSubstr("--tls_cert: cannot open "
                                          "/no/such/server.pem"));

  ChildProcess bad_norm(Command({"--input_norm=0.1"}));
  EXPECT_EQ(bad_norm.Wait(kTimeout), 2);
  EXPECT_THAT(bad_norm.output(), HasSubstr("--input_norm=0.1: expected"));
}

TEST(CoordinatorProcessTest, ConfigFileSetsOptionsAndFlagsWin) {
  const std::string config = testing::WriteTempFile(
      "coordinator.textproto",
      "# a run of the 2NN\nmodel: \"mlp_2nn\"\nmin_clients: 5\n"
      "round_timeout: \"2m\"\nconvergence_threshold: 0.005\n");
  ASSERT_FALSE(config.empty());
  for (const bool override_model : {false, true}) {
    std::vector<std::string> flags = {"--config", config};
    if (override_model) flags.push_back("--model=fedavg_cnn");
    ChildProcess coordinator(Command(flags));
    const int port = StartCoordinator(coordinator);
    ASSERT_GT(port, 0) << coordinator.output();
    auto status = Connect(port)->GetStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->model().name(),
              override_model ? "fedavg_cnn" : "mlp_2nn");
  }
}

TEST(CoordinatorProcessTest, StrategyFromFlagsOrTheConfigFile) {
  ChildProcess flags(Command(
      {"--strategy=fedadam", "--strategy_config=tau: 0.01 beta_1: 0.5"}));
  int port = StartCoordinator(flags);
  ASSERT_GT(port, 0) << flags.output();
  auto status = Connect(port)->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->strategy(), "fedadam");
  EXPECT_THAT(status->strategy_config(), HasSubstr("beta_1: 0.5"));
  EXPECT_THAT(status->strategy_config(), HasSubstr("tau: 0.01"));
  EXPECT_THAT(status->strategy_config(), HasSubstr("beta_2: 0.99"));

  const std::string config = testing::WriteTempFile(
      "coordinator.textproto",
      "strategy: \"fedavgm\"\nstrategy_config { server_momentum: 0.7 }\n");
  ChildProcess file(Command({"--config=" + config}));
  port = StartCoordinator(file);
  ASSERT_GT(port, 0) << file.output();
  status = Connect(port)->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->strategy(), "fedavgm");
  EXPECT_THAT(status->strategy_config(), HasSubstr("server_momentum: 0.7"));
}

TEST(CoordinatorProcessTest, BadStrategyKnobsAreClearErrors) {
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"--strategy=fedsgd"}, "--strategy: \"fedsgd\": expected one of"},
           {{"--strategy=fedavg", "--strategy_config=beta_1: 0.9"},
            "beta_1 does not apply to --strategy=fedavg"},
           {{"--strategy=fedyogi", "--strategy_config=tau: -1"},
            "tau must be > 0"},
           {{"--strategy_config=server_learning_rate"}, "--strategy_config:1:"},
           {{"--mode=async", "--async_buffer=0"},
            "--async_buffer: must be at least 1"},
       }) {
    ChildProcess coordinator(Command(c.flags));
    EXPECT_EQ(coordinator.Wait(kTimeout), 2) << c.flags.back();
    EXPECT_THAT(coordinator.output(), HasSubstr(c.says)) << c.flags.back();
  }
}

// --model=PATH.safetensors: a file the coordinator cannot serve stops it at
// startup, exit 2, with a message naming the file and what is wrong, for each
// way a file can be bad (the reader's own test has the same cases, in
// process; this is what a user starting the binary sees).
TEST(CoordinatorProcessTest, BadModelFilesAreClearErrors) {
  const std::string w =
      R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
  const std::string b =
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[24,32]})";
  const std::string data(32, '\0');  // 8 float zeros
  // A safetensors file: the header's length (8 bytes, little-endian), the
  // header, the data.
  auto file = [](const std::string& header, const std::string& bytes) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) {
      out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    }
    return out + header + bytes;
  };
  auto replace = [](std::string s, const std::string& from,
                    const std::string& to) {
    return s.replace(s.find(from), from.size(), to);
  };
  struct Case {
    std::string what;
    std::string contents;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"truncated", file("{" + w + "," + b + "}", data.substr(0, 20)),
            "truncated"},
           {"bad header JSON", file("{" + w + "," + b, data), "bad header"},
           {"overlapping offsets",
            file("{" + w + "," + replace(b, "[24,32]", "[16,24]") + "}", data),
            "overlap"},
           {"duplicate names", file("{" + w + "," + w + "}", data), "\"w\""},
           {"non-float dtype",
            file("{" + replace(w, "F32", "I64") + "," + b + "}", data),
            "tensor w: dtype I64"},
           {"half floats",
            file("{" + w + "," + replace(b, "F32", "F16") + "}", data),
            "tensor b: dtype F16"},
           {"shorter than its length field", std::string("\x10\0\0", 3),
            "shorter than the 8-byte header length"},
       }) {
    const std::string path =
        testing::WriteTempFile("model.safetensors", c.contents);
    ChildProcess coordinator(Command({"--model=" + path}));
    EXPECT_EQ(coordinator.Wait(kTimeout), 2) << c.what;
    EXPECT_THAT(coordinator.output(), HasSubstr(path)) << c.what;
    EXPECT_THAT(coordinator.output(), HasSubstr(c.says)) << c.what;
  }
}

TEST(CoordinatorProcessTest, BadConfigFileIsAClearError) {
  struct Case {
    std::string text;  // the file
    std::string says;  // in the coordinator's output
  };
  for (const Case& c : std::vector<Case>{
           {"max_rounds: 3\nmax_round: 4\n",
            "coordinator.textproto:2:10: Message type "
            "\"fedlearn.v1.CoordinatorConfig\" has no field named "
            "\"max_round\""},
           {"max_rounds: \"ten\"\n", "coordinator.textproto:1:13: Expected"},
           {"round_timeout: \"soon\"\n",
            "coordinator.textproto: round_timeout: "},
           // Values pass the same checks as the flags.
           {"tolerance: 1.5\n", "--tolerance: must be in [0, 1)"},
       }) {
    const std::string config =
        testing::WriteTempFile("coordinator.textproto", c.text);
    ChildProcess coordinator(Command({"--config=" + config}));
    EXPECT_EQ(coordinator.Wait(kTimeout), 2) << c.text;
    EXPECT_THAT(coordinator.output(), HasSubstr(c.says)) << c.text;
  }
  ChildProcess missing(Command({"--config=/no/such/coordinator.textproto"}));
  EXPECT_EQ(missing.Wait(kTimeout), 2);
  EXPECT_THAT(missing.output(),
              HasSubstr("--config=/no/such/coordinator.textproto: "));
}

TEST(CoordinatorProcessTest, ConfigMessageHasAFieldForEveryFlag) {
  ChildProcess help({FEDLEARN_COORDINATOR_BINARY, "--help"});
  ASSERT_TRUE(help.Wait(kTimeout).has_value());
  ChildProcess schema({FEDLEARN_COORDINATOR_BINARY, "--config_schema"});
  ASSERT_EQ(schema.Wait(kTimeout), 0);
  EXPECT_THAT(testing::ConfigMismatches(help.output(), schema.output()),
              ::testing::IsEmpty());
  // Each field has its flag's type and help; the knobs are a message.
  EXPECT_THAT(schema.output(), HasSubstr("message CoordinatorConfig {"));
  EXPECT_THAT(schema.output(), HasSubstr("optional int32 max_rounds = "));
  EXPECT_THAT(schema.output(), HasSubstr("optional double tolerance = "));
  EXPECT_THAT(schema.output(), HasSubstr("optional string round_timeout = "));
  EXPECT_THAT(schema.output(), HasSubstr("optional .fedlearn.v1.StrategyConfig "
                                         "strategy_config = "));
  EXPECT_THAT(schema.output(),
              HasSubstr("// share of the selected clients that may stay "
                        "silent (default: 0.3)"));
}

TEST(CoordinatorProcessTest, HelpListsEveryFlagWithItsDefault) {
  ChildProcess help({FEDLEARN_COORDINATOR_BINARY, "--help"});
  ASSERT_TRUE(help.Wait(kTimeout).has_value());
  for (const char* flag :
       {"--port", "--min_clients", "--clients_per_round", "--fraction",
        "--over_selection", "--tolerance", "--round_timeout", "--max_rounds",
        "--rounds_between_validations", "--convergence_threshold",
        "--join_token", "--seed", "--model"}) {
    EXPECT_THAT(help.output(), HasSubstr(absl::StrCat(flag, " ("))) << flag;
  }
  EXPECT_THAT(help.output(), HasSubstr("default: 0.3"));
}

TEST(CoordinatorProcessTest, ReadmeDocumentsEveryFlag) {
  ChildProcess help({FEDLEARN_COORDINATOR_BINARY, "--help"});
  ASSERT_TRUE(help.Wait(kTimeout).has_value());
  const std::string readme =
      testing::ReadFile(absl::StrCat(FEDLEARN_SOURCE_DIR, "/README.md"));
  ASSERT_FALSE(readme.empty());
  const std::vector<std::string> flags = testing::FlagsInHelp(help.output());
  EXPECT_GE(flags.size(), 25u);
  for (const std::string& flag : flags) {
    EXPECT_THAT(readme, HasSubstr(absl::StrCat("| `", flag, "` |")))
        << flag << " is missing from the README's coordinator flag table";
  }
}

}  // namespace
}  // namespace fedlearn
