// Agents against a real coordinator (CoordinatorServer on a loopback socket),
// each with a scripted trainer whose updates and metrics are known in advance,
// so the coordinator's model and evaluation can be checked exactly.

#include "client/agent.h"

#include <grpcpp/channel.h>
#include <grpcpp/create_channel.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/run_controller.h"
#include "tests/client/fake_trainer.h"
#include "tests/util/files.h"

namespace fedlearn {
namespace {

using ::fedlearn::testing::FakeFactory;
using ::fedlearn::testing::Script;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kWait = absl::Seconds(30);  // upper bound, never slept
constexpr uint64_t kModelSeed = 7;

// An agent running on its own thread. The destructor stops and joins it.
class AgentThread {
 public:
  AgentThread(AgentOptions options, TrainerFactory factory)
      : agent_(std::move(options), std::move(factory)), thread_([this] {
          result_ = agent_.Run();
          done_.Notify();
        }) {}
  ~AgentThread() {
    agent_.Stop();
    thread_.join();
  }

  // Run's result, or nullopt if it has not returned within `timeout`.
  std::optional<absl::StatusOr<AgentSummary>> Wait(absl::Duration timeout) {
    if (!done_.WaitForNotificationWithTimeout(timeout)) return std::nullopt;
    return result_;
  }

  Agent& agent() { return agent_; }

 private:
  Agent agent_;
  absl::StatusOr<AgentSummary> result_;
  absl::Notification done_;
  std::thread thread_;  // last: starts once the rest is built
};

CoordinatorOptions SmallRun() {
  CoordinatorOptions o;
  o.model = "mlp_2nn";  // 199,210 parameters: quick to move around
  o.seed = kModelSeed;
  o.min_clients = 1;
  o.clients_per_round = 1;
  o.max_rounds = 1;
  o.round_timeout = absl::Seconds(30);
  o.eval_timeout = absl::Seconds(30);
  o.convergence_threshold = 0.0;  // only a rising loss converges
  o.rounds_between_validations = 2;
  return o;
}

std::vector<float> InitialWeights() {
  const ModelSpec spec = *LookupModel("mlp_2nn");
  std::vector<float> w(static_cast<size_t>(spec.num_parameters));
  InitializeParameters(spec, kModelSeed, absl::MakeSpan(w));
  return w;
}

// The global model after one FedAvg round in which client i moved every weight
// by adds[i] with weight examples[i], computed the way the agent (delta =
// trained - received, in float) and the coordinator (global + weighted mean,
// in double) do.
void ApplyRound(const std::vector<float>& adds,
                const std::vector<int64_t>& examples,
                std::vector<float>* weights) {
  double total = 0;
  for (int64_t n : examples) total += static_cast<double>(n);
  for (float& w : *weights) {
    double sum = 0;
    for (size_t i = 0; i < adds.size(); ++i) {
      const float trained = w + adds[i];
      const float delta = trained - w;
      sum += static_cast<double>(examples[i]) * static_cast<double>(delta);
    }
    w = static_cast<float>(static_cast<double>(w) + sum / total);
  }
}

// Spins until `condition` holds or `timeout` passes; returns whether it held.
// For state that offers nothing to wait on (the coordinator's view of a
// client's heartbeats).
bool Eventually(const std::function<bool()>& condition,
                absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    std::this_thread::yield();
  }
  return condition();
}

// A console in `mode` that appends what it draws to `*out`, and each log line
// as "LOG <line>\n", under `*mu`; 100 columns wide.
std::shared_ptr<ProgressConsole> CapturingConsole(
    ProgressMode mode, std::shared_ptr<std::string> out,
    std::shared_ptr<absl::Mutex> mu) {
  ProgressConsole::Options console;
  console.mode = mode;
  console.write = [out, mu](absl::string_view text) {
    absl::MutexLock lock(mu.get());
    absl::StrAppend(out.get(), text);
  };
  console.log = [out, mu](const std::string& line) {
    absl::MutexLock lock(mu.get());
    absl::StrAppend(out.get(), "LOG ", line, "\n");
  };
  console.width = [] { return 100; };
  return std::make_shared<ProgressConsole>(std::move(console));
}

class AgentTest : public ::testing::Test {
 protected:
  void Start(const CoordinatorOptions& options, int port = 0) {
    auto server =
        CoordinatorServer::Start(options, absl::StrCat("127.0.0.1:", port));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    port_ = server_->port();
  }

  AgentOptions Options(const std::string& name) const {
    AgentOptions o;
    o.coordinator = absl::StrCat("127.0.0.1:", port_);
    o.display_name = name;
    o.initial_backoff = absl::Milliseconds(20);
    o.max_backoff = absl::Milliseconds(200);
    o.poll_wait = absl::Seconds(5);
    o.reconnect_timeout = kWait;
    o.jitter_seed = 1;
    return o;
  }

  static AgentSummary Done(AgentThread& agent) {
    std::optional<absl::StatusOr<AgentSummary>> result = agent.Wait(kWait);
    if (!result.has_value()) {
      ADD_FAILURE() << "agent did not finish within " << kWait;
      return {};
    }
    if (!result->ok()) {
      ADD_FAILURE() << result->status();
      return {};
    }
    return **result;
  }

  std::unique_ptr<CoordinatorServer> server_;
  int port_ = 0;
};

TEST_F(AgentTest, ThreeAgentsRunToDone) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 3;
  o.clients_per_round = 3;
  o.max_rounds = 2;
  Start(o);
  const std::vector<float> adds = {0.01f, 0.02f, 0.03f};
  const std::vector<int64_t> examples = {100, 200, 300};
  const std::vector<EvalMetrics> evals = {
      {50, 0.3, 0.7}, {100, 0.2, 0.8}, {150, 0.1, 0.9}};
  std::vector<std::unique_ptr<AgentThread>> agents;
  for (int i = 0; i < 3; ++i) {
    Script script;
    script.add = adds[i];
    script.num_examples = examples[i];
    script.loss = 1.0 + i;
    script.validation_loss = 0.5 + i;
    script.eval = evals[i];
    agents.push_back(std::make_unique<AgentThread>(
        Options(absl::StrCat("agent-", i)), FakeFactory(script)));
  }
  const int64_t model_bytes =
      4 * static_cast<int64_t>(server_->controller().spec().num_parameters);
  for (int i = 0; i < 3; ++i) {
    const AgentSummary summary = Done(*agents[i]);
    EXPECT_EQ(summary.joins, 1);
    EXPECT_EQ(summary.rounds_trained, 2);
    EXPECT_EQ(summary.updates_rejected, 0);
    EXPECT_EQ(summary.last_train.num_examples, examples[i]);
    EXPECT_TRUE(summary.evaluated);
    EXPECT_EQ(summary.last_eval.num_examples, evals[i].num_examples);
    EXPECT_EQ(summary.bytes_sent, 2 * model_bytes);
    EXPECT_EQ(summary.bytes_received, 3 * model_bytes);  // 2 TRAIN, 1 EVALUATE
    EXPECT_GT(summary.wall_time, absl::ZeroDuration());
    // Each pushed update was wiped once the coordinator took it.
    EXPECT_FALSE(agents[i]->agent().HoldsUpdateValues()) << i;
  }
  EXPECT_TRUE(server_->controller().AwaitClientsDone(absl::ZeroDuration()));

  std::vector<float> expected = InitialWeights();
  ApplyRound(adds, examples, &expected);
  ApplyRound(adds, examples, &expected);
  const std::vector<float> global = *server_->controller().global_weights();
  ASSERT_EQ(global.size(), expected.size());
  for (size_t i = 0; i < global.size(); ++i)
    ASSERT_EQ(global[i], expected[i]) << "parameter " << i;

  const v1::GetStatusResponse status = server_->controller().GetStatus();
  EXPECT_EQ(status.phase(), v1::PHASE_DONE);
  ASSERT_EQ(status.history_size(), 3);
  for (int r = 0; r < 2; ++r) {
    const v1::RoundMetrics& m = status.history(r).metrics();
    EXPECT_EQ(status.history(r).outcome(), "all");
    EXPECT_EQ(m.num_examples(), 600);
    EXPECT_NEAR(m.train_loss(), (1.0 * 100 + 2.0 * 200 + 3.0 * 300) / 600,
                1e-12);
    EXPECT_EQ(m.has_validation(), r == 1);  // every 2nd round
  }
  EXPECT_NEAR(status.history(1).metrics().validation_loss(), 1.5, 1e-12);
  const v1::EvaluationResult& eval = status.final_evaluation();
  EXPECT_EQ(eval.num_clients(), 3);
  EXPECT_EQ(eval.num_examples(), 300);
  EXPECT_NEAR(eval.test_loss(), (0.3 * 50 + 0.2 * 100 + 0.1 * 150) / 300,
              1e-12);
  EXPECT_NEAR(eval.test_accuracy(), (0.7 * 50 + 0.8 * 100 + 0.9 * 150) / 300,
              1e-12);
}

TEST_F(AgentTest, RejoinsACoordinatorRestartedOnTheSamePort) {
  CoordinatorOptions first = SmallRun();
  first.min_clients = 2;  // never starts with one agent: it waits, polling
  Start(first);
  const int port = port_;
  AgentOptions options = Options("phoenix");
  // The test's own handle on the agent's channel, to see it fail to connect.
  options.channel =
      MakeCoordinatorChannel(options.coordinator, options.max_backoff);
  std::shared_ptr<grpc::Channel> channel = options.channel;
  auto built = std::make_shared<std::atomic<int>>(0);
  AgentThread agent(options, FakeFactory(Script(), built));
  ASSERT_TRUE(server_->controller().AwaitPendingPolls(1, kWait));
  server_->Shutdown();
  server_.reset();

  // The agent keeps trying while nothing listens: its channel goes through
  // TRANSIENT_FAILURE.
  const absl::Time deadline = absl::Now() + kWait;
  grpc_connectivity_state state = channel->GetState(false);
  while (state != GRPC_CHANNEL_TRANSIENT_FAILURE &&
         channel->WaitForStateChange(state, absl::ToChronoTime(deadline))) {
    state = channel->GetState(false);
  }
  ASSERT_EQ(state, GRPC_CHANNEL_TRANSIENT_FAILURE);

  // The new coordinator knows nothing of the agent: its next poll is answered
  // NOT_FOUND and it must join again.
  const absl::Time restarted = absl::Now();
  Start(SmallRun(), port);
  const AgentSummary summary = Done(agent);
  // The agent drives its channel's reconnection while it backs off; left to
  // itself, gRPC's synchronous client would notice the new coordinator only
  // at its 5s backup poll.
  EXPECT_LT(absl::Now() - restarted, absl::Seconds(4));
  EXPECT_EQ(summary.joins, 2);
  EXPECT_EQ(summary.rounds_trained, 1);
  EXPECT_TRUE(summary.evaluated);
  // The restarted coordinator had no state: a new run (a new run id), whose
  // plan may scale inputs or seed differently, so the trainer is built anew.
  EXPECT_EQ(*built, 2) << "a new run gets a new trainer";
  EXPECT_EQ(server_->controller().phase(), v1::PHASE_DONE);
  std::vector<float> expected = InitialWeights();
  ApplyRound({0.01f}, {100}, &expected);
  EXPECT_EQ(*server_->controller().global_weights(), expected);
}

// reconnect_timeout counts from the first call that failed, not from the last
// one answered: a round that trains for longer than it (heartbeats answered
// meanwhile) is not silence, and a push that then fails is retried.
TEST_F(AgentTest, ARoundLongerThanTheReconnectTimeoutIsNotSilence) {
  Start(SmallRun());
  const int port = port_;
  absl::Notification trained, down;
  Script script;
  // Counted across trainers: the restarted coordinator is a new run, for
  // which the agent builds a new one.
  std::atomic<int> calls{0};
  script.on_train = [&](int, const ProgressFn&) {
    if (calls++ != 0) return;
    absl::SleepFor(absl::Milliseconds(1500));  // longer than the timeout
    trained.Notify();
    // The push comes once the coordinator is gone.
    EXPECT_TRUE(down.WaitForNotificationWithTimeout(kWait));
  };
  AgentOptions options = Options("patient");
  options.reconnect_timeout = absl::Seconds(1);
  AgentThread agent(options, FakeFactory(script));
  ASSERT_TRUE(trained.WaitForNotificationWithTimeout(kWait));
  server_->Shutdown();
  server_.reset();
  down.Notify();
  // Back within the timeout of the push's first failure; it has forgotten
  // the agent, which joins again and trains the new run's round.
  absl::SleepFor(absl::Milliseconds(300));
  Start(SmallRun(), port);
  const AgentSummary summary = Done(agent);
  EXPECT_EQ(summary.joins, 2);
  EXPECT_EQ(summary.rounds_trained, 1);
  // An update trained in another run (whose plan may differ) is not pushed
  // into this one, even for the same round and the same initial weights.
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(server_->controller().phase(), v1::PHASE_DONE);
}

// A coordinator restarted from its state directory resumes the round it was
// in but knows no client: the push of an update trained in that round is
// answered NOT_FOUND. The agent joins again and, asked for the same round with
// the same weights under its new identity, pushes the update it holds instead
// of training it again (README, "The client").
TEST_F(AgentTest, AnUpdateRefusedByARestartedCoordinatorIsPushedAgain) {
  testing::ScopedTempDir dir;
  CoordinatorOptions options = SmallRun();
  options.max_rounds = 2;
  options.state_dir = dir.Path("state");
  Start(options);
  const int port = port_;
  absl::Notification training_round_2, restarted;
  std::atomic<int> trained{0};
  Script script;
  script.on_train = [&](int call, const ProgressFn&) {
    ++trained;
    if (call != 1) return;
    training_round_2.Notify();
    EXPECT_TRUE(restarted.WaitForNotificationWithTimeout(kWait));
  };
  auto built = std::make_shared<std::atomic<int>>(0);
  AgentThread agent(Options("survivor"), FakeFactory(script, built));
  ASSERT_TRUE(training_round_2.WaitForNotificationWithTimeout(kWait));
  const std::string run_id = server_->controller().run_id();
  server_->Shutdown();
  server_.reset();
  Start(options, port);
  ASSERT_EQ(server_->controller().run_id(), run_id) << "not resumed";
  restarted.Notify();

  const AgentSummary summary = Done(agent);
  EXPECT_EQ(trained, 2) << "round 2 was trained again";
  EXPECT_EQ(summary.joins, 2);
  // Numbered after the clients of the run before the restart: round 1's
  // record names client-1, which is not the new identity.
  EXPECT_EQ(summary.client_id, "client-2");
  EXPECT_EQ(summary.rounds_trained, 2);
  EXPECT_EQ(summary.updates_rejected, 0);
  EXPECT_EQ(*built, 1) << "the resumed run keeps the trainer";
  EXPECT_EQ(server_->controller().phase(), v1::PHASE_DONE);
  std::vector<float> expected = InitialWeights();
  ApplyRound({0.01f}, {100}, &expected);
  ApplyRound({0.01f}, {100}, &expected);
  EXPECT_EQ(*server_->controller().global_weights(), expected);
}

// Two live agents sharing a session file would retire each other at every
// re-join, each presenting the identity the other saved. The second one is
// refused at its start, and the first goes on untouched; the lock goes with
// the agent that held it.
TEST_F(AgentTest, TwoRunningAgentsCannotShareASessionFile) {
  CoordinatorOptions options = SmallRun();
  options.min_clients = 2;  // the first agent waits, polling
  Start(options);
  testing::ScopedTempDir dir;
  AgentOptions twin = Options("twin");
  twin.session_file = dir.Path("twin.session");
  {
    AgentThread first(twin, FakeFactory(Script()));
    ASSERT_TRUE(server_->controller().AwaitPendingPolls(1, kWait));
    Agent second(twin, FakeFactory(Script()));
    const absl::StatusOr<AgentSummary> refused = second.Run();
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(),
                HasSubstr("twin.session is in use by another running agent"));
    // Refused before it joined: one client, the first, still polling.
    EXPECT_EQ(server_->controller().GetStatus().client_counts().joined(), 1);
    EXPECT_TRUE(server_->controller().AwaitPendingPolls(1, kWait));
  }
  // The first has ended: an agent started on its file now runs, and retires
  // the identity it left behind.
  AgentThread third(twin, FakeFactory(Script()));
  AgentThread other(Options("other"), FakeFactory(Script()));
  EXPECT_NE(Done(third).client_id, "client-1");
  Done(other);
  const v1::GetStatusResponse status = server_->controller().GetStatus();
  EXPECT_EQ(status.client_counts().joined(), 3);
  // Stopped a moment ago, it would count alive for --client_timeout (20 s)
  // had it not been retired.
  ASSERT_GE(status.clients_size(), 1);
  EXPECT_EQ(status.clients(0).client_id(), "client-1");
  EXPECT_EQ(status.clients(0).state(), "gone");
}

// A coordinator at --max_clients refuses a join RESOURCE_EXHAUSTED until a
// slot frees, as a gone client times out (a fleet restarted at once finds its
// old identities holding the slots): the agent tries again after a backoff
// rather than end after --max_repeated_errors quick refusals.
TEST_F(AgentTest, AJoinRefusedAtMaxClientsIsTriedAgainUntilASlotFrees) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 1;
  o.clients_per_round = 1;
  o.max_rounds = 1;
  o.max_clients = 1;
  o.client_timeout = absl::Seconds(1);
  o.round_timeout = absl::Seconds(2);  // the silent one may be sampled first
  Start(o);
  // Joins, holds the only slot, and says nothing more.
  CoordinatorClient silent(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(silent.Join(v1::JoinRequest()).ok());
  AgentOptions options = Options("patient");
  options.max_repeated_errors = 3;
  AgentThread agent(options, FakeFactory(Script()));
  const AgentSummary summary = Done(agent);
  EXPECT_EQ(summary.joins, 1);
  EXPECT_EQ(summary.rounds_trained, 1);
}

TEST_F(AgentTest, WrongJoinTokenIsUnauthenticated) {
  CoordinatorOptions o = SmallRun();
  o.join_token = "s3cret";
  Start(o);
  AgentOptions options = Options("stranger");
  options.join_token = "guess";
  auto built = std::make_shared<std::atomic<int>>(0);
  Agent agent(options, FakeFactory(Script(), built));
  const absl::Time start = absl::Now();
  absl::StatusOr<AgentSummary> result = agent.Run();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnauthenticated)
      << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr("join token"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(*built, 0);
}

TEST_F(AgentTest, StopEndsALongPoll) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 2;
  Start(o);
  AgentOptions options = Options("stoppable");
  options.poll_wait = kWait;  // the coordinator would hold the poll 30s
  AgentThread agent(options, FakeFactory(Script()));
  ASSERT_TRUE(server_->controller().AwaitPendingPolls(1, kWait));
  agent.agent().Stop();
  std::optional<absl::StatusOr<AgentSummary>> result =
      agent.Wait(absl::Seconds(5));
  ASSERT_TRUE(result.has_value()) << "Run did not return after Stop";
  EXPECT_EQ(result->status().code(), absl::StatusCode::kCancelled)
      << result->status();
}

TEST_F(AgentTest, StopEndsTheBackoff) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 2;
  Start(o);
  AgentOptions options = Options("patient");
  options.initial_backoff = kWait;  // the first retry would come after 30s
  options.max_backoff = kWait;
  AgentThread agent(options, FakeFactory(Script()));
  ASSERT_TRUE(server_->controller().AwaitPendingPolls(1, kWait));
  // The poll fails UNAVAILABLE and the agent backs off.
  server_->Shutdown();
  server_.reset();
  agent.agent().Stop();
  std::optional<absl::StatusOr<AgentSummary>> result =
      agent.Wait(absl::Seconds(5));
  ASSERT_TRUE(result.has_value()) << "Run did not return after Stop";
  EXPECT_EQ(result->status().code(), absl::StatusCode::kCancelled);
}

TEST_F(AgentTest, StopBeforeRunReturnsAtOnce) {
  Start(SmallRun());
  Agent agent(Options("early"), FakeFactory(Script()));
  agent.Stop();
  agent.Stop();  // idempotent
  EXPECT_EQ(agent.Run().status().code(), absl::StatusCode::kCancelled);
}

TEST_F(AgentTest, UnreachableCoordinatorIsUnavailableAfterReconnectTimeout) {
  Start(SmallRun());
  server_->Shutdown();
  server_.reset();
  AgentOptions options = Options("lonely");
  options.reconnect_timeout = absl::Milliseconds(300);
  Agent agent(options, FakeFactory(Script()));
  absl::StatusOr<AgentSummary> result = agent.Run();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable)
      << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr("lonely"));
}

TEST_F(AgentTest, HeartbeatsReportProgressWhileTraining) {
  CoordinatorOptions o = SmallRun();
  o.heartbeat_interval = absl::Milliseconds(20);
  Start(o);
  std::atomic<bool> seen{false};
  Script script;
  script.on_train = [this, &seen](int, const ProgressFn& progress) {
    progress(3, 7);
    seen = Eventually(
        [this] {
          const v1::GetStatusResponse status =
              server_->controller().GetStatus();
          return status.clients_size() == 1 &&
                 status.clients(0).batches_done() == 3 &&
                 status.clients(0).batches_total() == 7;
        },
        kWait);
  };
  AgentThread agent(Options("beating"), FakeFactory(script));
  const AgentSummary summary = Done(agent);
  EXPECT_TRUE(seen) << "the coordinator never saw the progress";
  EXPECT_EQ(summary.rounds_trained, 1);
}

TEST_F(AgentTest, ProgressConsoleShowsBarsAndCarriesTheLogLines) {
  Start(SmallRun());
  Script script;
  script.on_train = [](int, const ProgressFn& progress) {
    TrainProgress p;
    p.epochs = 1;
    p.epoch = 1;
    p.epoch_batches = 2;
    p.total = 2;
    for (int b = 1; b <= 2; ++b) {
      p.done = p.epoch_batches_done = b;
      p.epoch_examples_done = 10 * b;
      progress(p);
    }
  };
  auto out = std::make_shared<std::string>();
  auto mu = std::make_shared<absl::Mutex>();
  AgentOptions options = Options("barred");
  options.progress = CapturingConsole(ProgressMode::kBar, out, mu);
  AgentThread agent(std::move(options), FakeFactory(script));
  Done(agent);
  absl::MutexLock lock(mu.get());
  EXPECT_THAT(*out, HasSubstr("\rbarred round 1 epoch 1/1 ["));
  // The epoch's bar ends its line before the round's line is logged.
  EXPECT_THAT(*out, HasSubstr("100%"));
  EXPECT_THAT(*out, ::testing::ContainsRegex(
                        "100%[^\n]*\n(LOG [^\n]*\n)*LOG barred: round 1: "
                        "loss 1.0000 accuracy 0.5000"));
  EXPECT_THAT(*out, HasSubstr("LOG barred: joined"));
}

TEST_F(AgentTest, ProgressNoneDropsOnlyTheRoundLines) {
  Start(SmallRun());
  auto out = std::make_shared<std::string>();
  auto mu = std::make_shared<absl::Mutex>();
  AgentOptions options = Options("quiet");
  options.progress = CapturingConsole(ProgressMode::kNone, out, mu);
  AgentThread agent(std::move(options), FakeFactory(Script()));
  EXPECT_EQ(Done(agent).rounds_trained, 1);
  absl::MutexLock lock(mu.get());
  EXPECT_THAT(*out, Not(HasSubstr("quiet: round 1:")));
  EXPECT_THAT(*out, HasSubstr("LOG quiet: joined"));
  EXPECT_THAT(*out, HasSubstr("LOG quiet: evaluation"));
  EXPECT_THAT(*out, Not(HasSubstr("\r")));
}

TEST_F(AgentTest, UpdateForAClosedRoundIsNotFatal) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 2;
  o.clients_per_round = 2;
  o.tolerance = 0.5;  // one update of two closes a round
  o.max_rounds = 2;
  Start(o);
  AgentThread fast(Options("fast"), FakeFactory(Script()));
  Script slow_script;
  // The slow agent's first round closes on the fast agent's update while the
  // slow one trains. That is round 1, or round 2 when the fast agent closed
  // round 1 before the slow one first polled (its thread held up on a loaded
  // machine): wait for the round the slow agent actually holds.
  slow_script.on_train = [this](int call, const ProgressFn&) {
    if (call == 0) {
      const int64_t round = server_->controller().GetStatus().round();
      EXPECT_TRUE(server_->controller().AwaitHistory(static_cast<size_t>(round),
                                                     kWait));
    }
  };
  AgentThread slow(Options("slow"), FakeFactory(slow_script));
  const AgentSummary fast_summary = Done(fast);
  const AgentSummary slow_summary = Done(slow);
  // Round 1 is the fast agent's; round 2 goes to whichever pushes first.
  EXPECT_GE(fast_summary.rounds_trained, 1);
  EXPECT_GE(slow_summary.updates_rejected, 1);
  EXPECT_EQ(fast_summary.rounds_trained + slow_summary.rounds_trained, 2);
  EXPECT_EQ(server_->controller().phase(), v1::PHASE_DONE);
}

TEST_F(AgentTest, RepeatedlyRejectedUpdateIsFatal) {
  Start(SmallRun());
  Script script;
  script.num_examples = 0;  // the coordinator refuses: INVALID_ARGUMENT
  AgentOptions options = Options("broken");
  options.max_repeated_errors = 3;
  AgentThread agent(options, FakeFactory(script));
  std::optional<absl::StatusOr<AgentSummary>> result = agent.Wait(kWait);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kInvalidArgument)
      << result->status();
  EXPECT_THAT(result->status().message(), HasSubstr("3 times in a row"));
}

}  // namespace
}  // namespace fedlearn
