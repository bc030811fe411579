// The run's rules over real gRPC on a loopback socket
// (server/run_controller.h): rounds from waiting to done, sampling, FedAvg and
// the other strategies, quorum and deadlines, convergence, the evaluation phase
// and async mode, driven by scripted clients (CoordinatorClient, the agent's
// own RPC layer) that push hand-made updates.

#include "server/run_controller.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "tests/server/scripted_clients.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;

using testing::Header;
using testing::kWait;
using testing::SmallRun;

class RunControllerTest : public testing::ServiceTest {};

TEST_F(RunControllerTest, RunsFromWaitingToDone) {
  Start(SmallRun());
  auto clients = JoinAll(2);
  EXPECT_EQ(Status().phase(), v1::PHASE_WAITING_FOR_CLIENTS);
  // Not enough clients: a poll is held, then answered WAIT.
  auto wait = clients[0]->RequestUpdate(absl::Milliseconds(50));
  ASSERT_TRUE(wait.ok()) << wait.status();
  EXPECT_EQ(wait->task.type(), v1::TASK_TYPE_WAIT);
  EXPECT_GT(wait->task.retry_after_ms(), 0);

  clients.push_back(Join());
  EXPECT_EQ(Status().phase(), v1::PHASE_TRAINING);

  std::vector<float> initial(NumParameters());
  InitializeParameters(server_->controller().spec(), 7,
                       absl::MakeSpan(initial));
  ASSERT_EQ(Global(), initial);

  for (int round = 1; round <= 3; ++round) {
    for (auto& c : clients) {
      auto task = NextTask(*c);
      ASSERT_EQ(task.task.type(), v1::TASK_TYPE_TRAIN);
      EXPECT_EQ(task.task.round(), round);
      EXPECT_EQ(task.task.run_validation(), round == 2);
      EXPECT_EQ(task.task.plan().batch_size(), 10);
      EXPECT_EQ(task.task.plan().optimizer(), "adadelta");
      // MNIST's pixel statistics standardise every client's inputs.
      EXPECT_FLOAT_EQ(task.task.plan().input_mean(), 0.1307f);
      EXPECT_FLOAT_EQ(task.task.plan().input_std(), 0.3081f);
      EXPECT_GT(task.task.deadline_ms(), 0);
      ASSERT_EQ(task.weights, Global());
      std::vector<float> delta(NumParameters(), 0.01f);
      auto header = Header(round, 100, 2.0 / round);
      if (round == 2) {
        header.set_validation_loss(1.5);
        header.set_validation_accuracy(0.6);
        header.set_num_validation_examples(10);
      }
      auto pushed = c->PushUpdate(header, delta);
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      EXPECT_EQ(pushed->round(), round);
    }
  }
  EXPECT_EQ(Status().phase(), v1::PHASE_EVALUATING);
  EXPECT_EQ(Status().stop_reason(), "max_rounds");

  for (auto& c : clients) {
    EXPECT_EQ(testing::Evaluate(*c, 0.1, 0.9, 50).weights, Global());
  }
  ASSERT_TRUE(server_->controller().AwaitPhase(v1::PHASE_DONE, kWait));
  for (auto& c : clients)
    EXPECT_EQ(NextTask(*c).task.type(), v1::TASK_TYPE_DONE);
  EXPECT_TRUE(server_->controller().AwaitClientsDone(absl::ZeroDuration()));

  v1::GetStatusResponse status = Status();
  ASSERT_EQ(status.history_size(), 4);
  for (int r = 0; r < 3; ++r) {
    const v1::RoundRecord& record = status.history(r);
    EXPECT_EQ(record.round(), r + 1);
    EXPECT_FALSE(record.evaluation());
    EXPECT_EQ(record.outcome(), "all");
    EXPECT_EQ(record.selected(), 3);
    EXPECT_EQ(record.responded(), 3);
    EXPECT_EQ(record.metrics().num_examples(), 300);
    EXPECT_DOUBLE_EQ(record.metrics().train_loss(), 2.0 / (r + 1));
    EXPECT_EQ(record.metrics().has_validation(), r == 1);
    EXPECT_EQ(record.bytes_received(),
              3 * 4 * static_cast<int64_t>(NumParameters()));
  }
  EXPECT_DOUBLE_EQ(status.history(1).metrics().validation_loss(), 1.5);
  EXPECT_TRUE(status.history(3).evaluation());
  EXPECT_DOUBLE_EQ(status.final_evaluation().test_accuracy(), 0.9);
  EXPECT_EQ(status.final_evaluation().num_clients(), 3);
  // Three rounds each moved every weight by the mean delta, 0.01.
  std::vector<float> expected = initial;
  for (int r = 0; r < 3; ++r) {
    for (float& w : expected) w = static_cast<float>(double{w} + double{0.01f});
  }
  EXPECT_EQ(Global(), expected);
}

// The display names sampled for round 1 by a fresh coordinator (seed 7, 2 of
// 5 clients) whose clients join in `order`.
std::vector<std::string> SampledNames(const std::vector<std::string>& order) {
  CoordinatorOptions options = SmallRun();
  options.min_clients = static_cast<int>(order.size());
  options.clients_per_round = 2;
  auto server = CoordinatorServer::Start(options, "127.0.0.1:0");
  EXPECT_TRUE(server.ok()) << server.status();
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                          grpc::InsecureChannelCredentials());
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (const std::string& name : order) {
    clients.push_back(std::make_unique<CoordinatorClient>(channel));
    v1::JoinRequest join;
    join.set_display_name(name);
    EXPECT_TRUE(clients.back()->Join(join).ok());
  }
  const v1::GetStatusResponse status = (*server)->controller().GetStatus(
      ClientPage(), nullptr, kDefaultHistory, /*client_ids=*/true);
  std::vector<std::string> names;
  for (const std::string& id : status.current_round().selected_clients()) {
    for (const v1::ClientInfo& c : status.clients()) {
      if (c.client_id() == id) names.push_back(c.display_name());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A held poll is answered WAIT when its max_wait runs out, up to 50 ms early
// (polls expiring that close together are answered in one wakeup of the timer
// thread), never late: a poll expiring before the timer thread would next wake
// on its own (within a second) wakes it. Were it not woken, each of these
// polls, started just after the last one was answered, would wait for the
// next tick, about a second.
// A client that joined saying it does not evaluate (a Python SDK client
// without an evaluate function) is never sent EVALUATE: the attempt asks the
// others, and closes on their reports instead of waiting for one that cannot
// come.
TEST_F(RunControllerTest, AClientThatDoesNotEvaluateIsNeverAskedTo) {
  CoordinatorOptions o = SmallRun();
  o.max_rounds = 1;
  Start(o);
  auto clients = JoinAll(2);
  clients.push_back(std::make_unique<CoordinatorClient>(channel_));
  v1::JoinRequest request;
  request.set_no_evaluation(true);
  ASSERT_TRUE(clients.back()->Join(request).ok());
  for (auto& c : clients) testing::TrainConstant(*c, 1, 0.01f);
  ASSERT_EQ(Status().phase(), v1::PHASE_EVALUATING);
  EXPECT_EQ(Status().current_round().selected_clients_size(), 2);
  auto wait = clients[2]->RequestUpdate(absl::Milliseconds(100));
  ASSERT_TRUE(wait.ok()) << wait.status();
  EXPECT_EQ(wait->task.type(), v1::TASK_TYPE_WAIT);
  testing::Evaluate(*clients[0], 0.5, 0.75, 20);
  testing::Evaluate(*clients[1], 0.5, 0.75, 20);
  const v1::GetStatusResponse status = Status();
  EXPECT_EQ(status.phase(), v1::PHASE_DONE);
  EXPECT_EQ(status.final_evaluation().num_clients(), 2);
  EXPECT_EQ(NextTask(*clients[2]).task.type(), v1::TASK_TYPE_DONE);
}

// A run none of whose ready clients evaluates finishes at the end of
// training, without a final evaluation: an attempt would only wait out its
// deadline, again and again.
TEST_F(RunControllerTest, ARunNobodyCanEvaluateIsDoneWithoutAnEvaluation) {
  CoordinatorOptions o = SmallRun();
  o.max_rounds = 1;
  Start(o);
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<CoordinatorClient>(channel_));
    v1::JoinRequest request;
    request.set_no_evaluation(true);
    ASSERT_TRUE(clients.back()->Join(request).ok());
  }
  for (auto& c : clients) testing::TrainConstant(*c, 1, 0.01f);
  for (auto& c : clients) {
    EXPECT_EQ(NextTask(*c).task.type(), v1::TASK_TYPE_DONE);
  }
  const v1::GetStatusResponse status = Status();
  EXPECT_EQ(status.phase(), v1::PHASE_DONE);
  EXPECT_FALSE(status.has_final_evaluation());
  EXPECT_EQ(status.stop_reason(), "max_rounds");
}

TEST_F(RunControllerTest, AHeldPollIsAnsweredWhenItsMaxWaitRunsOut) {
  Start(SmallRun());
  auto clients = JoinAll(2);  // fewer than min_clients: every poll is held
  const absl::Time start = absl::Now();
  for (int i = 0; i < 8; ++i) {
    const absl::Time before = absl::Now();
    auto wait = clients[0]->RequestUpdate(absl::Milliseconds(100));
    ASSERT_TRUE(wait.ok()) << "poll " << i << ": " << wait.status();
    EXPECT_EQ(wait->task.type(), v1::TASK_TYPE_WAIT) << "poll " << i;
    EXPECT_GE(absl::Now() - before, absl::Milliseconds(40)) << "poll " << i;
  }
  // About 0.8 s; left to the timer's own ticks, about 8.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(RunControllerTest, ShuttingDownAnswersEveryCallerByName) {
  Start(SmallRun());
  auto clients = JoinAll(2);  // fewer than min_clients: a poll is held
  absl::StatusOr<CoordinatorClient::ReceivedTask> held;
  std::thread poller(
      [&] { held = clients[0]->RequestUpdate(absl::Seconds(30)); });
  // Once the poll is held, the run shuts down under it.
  ASSERT_TRUE(server_->controller().AwaitPendingPolls(1, absl::Seconds(10)));
  server_->controller().Shutdown();
  poller.join();
  EXPECT_EQ(held.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(held.status().message(),
              HasSubstr(absl::StrCat("client ", clients[0]->client_id(),
                                     ": coordinator is shutting down")));
  v1::HeartbeatRequest beat;
  beat.set_client_id(clients[1]->client_id());
  absl::Status late = clients[1]->Heartbeat(beat).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(late.message(),
              HasSubstr(absl::StrCat("client ", clients[1]->client_id(),
                                     ": coordinator is shutting down")));
}

TEST(CoordinatorSamplingTest, SameSeedAndNamesSampleAlikeWhateverTheJoinOrder) {
  const std::vector<std::string> names =
      SampledNames({"a", "b", "c", "d", "e"});
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(SampledNames({"e", "c", "a", "d", "b"}), names);
  EXPECT_EQ(SampledNames({"d", "e", "b", "c", "a"}), names);
}

// Also with client 0's update cut into chunk messages beforehand and sent by
// PushEncoded, as a load generator sends it: it counts like any other.
TEST_F(RunControllerTest, FedAvgIsTheExampleWeightedMean) {
  for (const bool encoded_first : {false, true}) {
    SCOPED_TRACE(encoded_first ? "PushEncoded" : "PushUpdate");
    Start(SmallRun());
    auto clients = JoinAll(3);
    const std::vector<float> before = Global();
    const int64_t examples[3] = {1, 2, 3};
    const float deltas[3] = {0.3f, -0.6f, 0.9f};
    PushPatterned(clients, examples, deltas, /*first_loss=*/1.0, encoded_first);
    // (1*0.3 + 2*(-0.6) + 3*0.9) / 6 = 0.3 times k, from the float inputs.
    ExpectPatternedMean(before, examples, deltas);
    // Train loss is weighted by examples too: (1*1 + 2*2 + 3*3) / 6.
    EXPECT_EQ(Status().history(0).responded(), 3);
    EXPECT_DOUBLE_EQ(Status().history(0).metrics().train_loss(), 14.0 / 6.0);
  }
}

TEST_F(RunControllerTest, RoundClosesAtQuorumWithoutWaitingForTheDeadline) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 10;
  o.clients_per_round = 10;
  o.round_timeout = absl::Minutes(10);
  Start(o);
  auto clients = JoinAll(10);
  const absl::Time start = absl::Now();
  // 30% of the selected stay silent.
  for (int i = 0; i < 7; ++i) {
    ASSERT_EQ(NextTask(*clients[i]).task.type(), v1::TASK_TYPE_TRAIN);
    EXPECT_EQ(Status().history_size(), 0) << "closed before quorum, at " << i;
    std::vector<float> delta(NumParameters(), 0.5f);
    ASSERT_TRUE(clients[i]->PushUpdate(Header(1, 10, 1.0), delta).ok());
  }
  ASSERT_TRUE(server_->controller().AwaitHistory(1, kWait));
  EXPECT_LT(absl::Now() - start, absl::Minutes(1));
  const v1::RoundRecord record = Status().history(0);
  EXPECT_EQ(record.outcome(), "quorum");
  EXPECT_EQ(record.responded(), 7);
  EXPECT_EQ(record.dropped(), 3);
  EXPECT_EQ(Status().round(), 2);
  // A straggler's late update is rejected, not counted.
  auto late = clients[9]->PushUpdate(Header(1, 10, 1.0),
                                     std::vector<float>(NumParameters()));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(late.status().message()),
              HasSubstr("current round is 2"));
}

TEST_F(RunControllerTest, RoundBelowQuorumAtDeadlineIsRetriedWithANewSample) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 4;
  o.clients_per_round = 2;
  o.round_timeout = absl::Milliseconds(400);
  Start(o);
  auto clients = JoinAll(6);
  const std::vector<float> before = Global();
  ASSERT_TRUE(server_->controller().AwaitHistory(3, kWait));
  v1::GetStatusResponse status = Status();
  ASSERT_GE(status.history_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(status.history(i).round(), 1);
    EXPECT_EQ(status.history(i).attempt(), i + 1);
    EXPECT_EQ(status.history(i).outcome(), "abandoned");
    EXPECT_EQ(status.history(i).dropped(), 2);
  }
  EXPECT_EQ(status.round(), 1);
  EXPECT_EQ(Global(), before);
  // Each attempt drew its own sample (deterministic for the seed; 15 possible
  // pairs).
  std::vector<std::vector<std::string>> samples;
  for (int i = 0; i < 3; ++i) {
    const auto& ids = status.history(i).selected_clients();
    EXPECT_EQ(ids.size(), 2);
    samples.emplace_back(ids.begin(), ids.end());
  }
  EXPECT_FALSE(samples[0] == samples[1] && samples[1] == samples[2]);
}

// The median over real pushes, in memory and spilled: an outlier claiming
// many examples moves nothing, and both paths give the same bits.
TEST_F(RunControllerTest, MedianIgnoresAnOutlierInMemoryOrSpilled) {
  std::vector<std::vector<float>> results;
  for (const char* memory : {"512MiB", "0"}) {
    CoordinatorOptions options = SmallRun();
    options.strategy = "fedmedian";
    options.aggregation_memory = memory;
    options.aggregation_spill_dir = ::testing::TempDir();
    Start(options);
    auto clients = JoinAll(3);
    const std::vector<float> before = Global();
    const int64_t examples[3] = {1, 2, 1000000};
    const float deltas[3] = {0.3f, -0.6f, 50.0f};
    PushPatterned(clients, examples, deltas, /*first_loss=*/1.0);
    const std::vector<float> after = Global();
    for (size_t j = 0; j < after.size(); ++j) {
      // Per parameter the middle of {0.3k, -0.6k, 50k}: 0.3k, whatever the
      // example counts.
      const float k = static_cast<float>(static_cast<int>(j % 5) - 2);
      ASSERT_EQ(after[j],
                static_cast<float>(double{before[j]} + double{0.3f * k}))
          << j;
    }
    results.push_back(after);
    server_.reset();
  }
  EXPECT_EQ(results[0], results[1]);
}

TEST(CoordinatorStrategyCheckTest, ARobustRunThatCannotFitIsRefusedAtStart) {
  CoordinatorOptions krum = SmallRun();  // 3 per round, tolerance 0.3: 3
  krum.strategy = "krum";
  auto refused = CoordinatorServer::Start(krum, "127.0.0.1:0");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("needs at least 5 updates per step, but a step may "
                        "complete with 3"));
  krum.clients_per_round = 10;
  krum.min_clients = 10;  // quorum 7 >= 2f + 3 = 5
  EXPECT_TRUE(CoordinatorServer::Start(krum, "127.0.0.1:0").ok());
  krum.strategy_config.set_num_byzantine(3);  // 9 > 7
  EXPECT_THAT(CoordinatorServer::Start(krum, "127.0.0.1:0").status().message(),
              HasSubstr("needs at least 9 updates"));

  // 10 x 13 x 796,840 bytes of mlp_2nn over 1 MiB, nowhere to spill.
  CoordinatorOptions median = SmallRun();
  median.strategy = "fedmedian";
  median.clients_per_round = 10;
  median.over_selection = 1.3;
  median.aggregation_memory = "1MiB";
  median.aggregation_spill_dir = "none";
  auto too_big = CoordinatorServer::Start(median, "127.0.0.1:0");
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.status().message(),
              HasSubstr("up to 13 updates (--clients_per_round=10"));
  EXPECT_THAT(too_big.status().message(),
              HasSubstr("of 0.8 MB = 10.4 MB, over --aggregation_memory=1MiB"));
  median.aggregation_memory = "12MiB";
  EXPECT_TRUE(CoordinatorServer::Start(median, "127.0.0.1:0").ok());
  median.aggregation_memory = "1MiB";
  median.aggregation_spill_dir = ::testing::TempDir();
  EXPECT_TRUE(CoordinatorServer::Start(median, "127.0.0.1:0").ok());
  median.aggregation_memory = "lots";
  EXPECT_THAT(
      CoordinatorServer::Start(median, "127.0.0.1:0").status().message(),
      HasSubstr("--aggregation_memory: \"lots\": expected N, NKiB"));
}

TEST_F(RunControllerTest, ConvergenceStartsTheEvaluationPhase) {
  CoordinatorOptions o = SmallRun();
  o.max_rounds = 50;
  o.convergence_threshold = 0.01;
  Start(o);
  auto clients = JoinAll(3);
  const double losses[] = {1.0, 0.9, 0.895};  // the last improves by 0.56% < 1%
  for (int round = 1; round <= 3; ++round) {
    ASSERT_EQ(Status().phase(), v1::PHASE_TRAINING);
    for (auto& c : clients) {
      ASSERT_EQ(NextTask(*c).task.type(), v1::TASK_TYPE_TRAIN);
      ASSERT_TRUE(c->PushUpdate(Header(round, 10, losses[round - 1]),
                                std::vector<float>(NumParameters(), 0.0f))
                      .ok());
    }
  }
  v1::GetStatusResponse status = Status();
  EXPECT_EQ(status.phase(), v1::PHASE_EVALUATING);
  EXPECT_EQ(status.stop_reason(), "converged");
  EXPECT_NEAR(status.history(1).relative_improvement(), 0.1, 1e-12);
  EXPECT_NEAR(status.history(2).relative_improvement(), 0.005 / 0.9, 1e-12);
  for (auto& c : clients)
    EXPECT_EQ(NextTask(*c).task.type(), v1::TASK_TYPE_EVALUATE);
}

TEST_F(RunControllerTest, MaxRoundsStopsTraining) {
  CoordinatorOptions o = SmallRun();
  o.max_rounds = 1;
  Start(o);
  auto clients = JoinAll(3);
  for (auto& c : clients) {
    ASSERT_EQ(NextTask(*c).task.type(), v1::TASK_TYPE_TRAIN);
    ASSERT_TRUE(
        c->PushUpdate(Header(1, 10, 1.0), std::vector<float>(NumParameters()))
            .ok());
  }
  EXPECT_EQ(Status().phase(), v1::PHASE_EVALUATING);
  EXPECT_EQ(Status().stop_reason(), "max_rounds");
  auto stale = clients[0]->PushUpdate(Header(2, 10, 1.0),
                                      std::vector<float>(NumParameters()));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RunControllerTest, EvaluationIsWeightedByTestSizeWithTolerance) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 4;
  o.clients_per_round = 4;
  o.max_rounds = 1;
  Start(o);
  auto clients = JoinAll(4);
  // Quorum of 4 at tolerance 0.3 is 3, in training as in evaluation: the fourth
  // client stays silent throughout.
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(NextTask(*clients[i]).task.type(), v1::TASK_TYPE_TRAIN);
    ASSERT_TRUE(clients[i]
                    ->PushUpdate(Header(1, 10, 1.0),
                                 std::vector<float>(NumParameters()))
                    .ok());
  }
  ASSERT_EQ(Status().phase(), v1::PHASE_EVALUATING);
  const double loss[] = {1.0, 2.0, 4.0};
  const double accuracy[] = {0.5, 1.0, 0.25};
  const int64_t size[] = {100, 300, 600};
  for (int i = 0; i < 3; ++i) {
    auto task = NextTask(*clients[i]);
    ASSERT_EQ(task.task.type(), v1::TASK_TYPE_EVALUATE);
    v1::ReportEvalRequest bad;
    bad.set_round(task.task.round());
    bad.set_test_accuracy(1.5);
    bad.set_num_examples(10);
    EXPECT_EQ(clients[i]->ReportEval(bad).code(),
              absl::StatusCode::kInvalidArgument);
    v1::ReportEvalRequest too_many = bad;
    too_many.set_test_accuracy(0.5);
    too_many.set_num_examples((int64_t{1} << 40) + 1);
    const absl::Status refused = clients[i]->ReportEval(too_many);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.message(), HasSubstr("num_examples in [1, 2^40]"));
    v1::ReportEvalRequest wrong_round = bad;
    wrong_round.set_round(7);
    wrong_round.set_test_accuracy(0.5);
    EXPECT_EQ(clients[i]->ReportEval(wrong_round).code(),
              absl::StatusCode::kFailedPrecondition);
    v1::ReportEvalRequest report;
    report.set_round(task.task.round());
    report.set_test_loss(loss[i]);
    report.set_test_accuracy(accuracy[i]);
    report.set_num_examples(size[i]);
    ASSERT_TRUE(clients[i]->ReportEval(report).ok());
    if (i == 0) {
      EXPECT_EQ(clients[i]->ReportEval(report).code(),
                absl::StatusCode::kAlreadyExists);
    }
  }
  ASSERT_TRUE(server_->controller().AwaitPhase(v1::PHASE_DONE, kWait));
  const v1::EvaluationResult result = Status().final_evaluation();
  // (100*1 + 300*2 + 600*4) / 1000 and (100*0.5 + 300*1 + 600*0.25) / 1000.
  EXPECT_DOUBLE_EQ(result.test_loss(), 3.1);
  EXPECT_DOUBLE_EQ(result.test_accuracy(), 0.5);
  EXPECT_EQ(result.num_examples(), 1000);
  EXPECT_EQ(result.num_clients(), 3);
  EXPECT_EQ(NextTask(*clients[3]).task.type(), v1::TASK_TYPE_DONE);
}

// --- Async mode -------------------------------------------------------------

CoordinatorOptions AsyncRun() {
  CoordinatorOptions o = SmallRun();
  o.mode = Mode::kAsync;
  o.min_clients = 2;
  o.max_rounds = 3;
  o.async_mixing = 0.5;
  o.staleness_exponent = 1.0;  // scale = 0.5 / (1 + staleness)
  return o;
}

// AsyncRun for three clients (min_clients) and ten versions, `tweak`ed.
CoordinatorOptions AsyncRunOfThree(
    const std::function<void(CoordinatorOptions&)>& tweak) {
  CoordinatorOptions o = AsyncRun();
  o.min_clients = 3;
  o.max_rounds = 10;
  tweak(o);
  return o;
}

// The model after applying `delta` (the same in every parameter) at `scale`,
// computed as the coordinator must: in float, parameter by parameter.
std::vector<float> Applied(std::vector<float> weights, double scale,
                           float delta) {
  const float step = static_cast<float>(scale);
  for (float& w : weights) w += step * delta;
  return weights;
}

TEST_F(RunControllerTest, AsyncAppliesEachUpdateScaledByItsStaleness) {
  Start(AsyncRun());
  auto a = Join();
  auto b = Join();
  const std::vector<float> initial = Global();
  // Both train the initial model, for round 1.
  auto task_a = NextTask(*a);
  auto task_b = NextTask(*b);
  ASSERT_EQ(task_a.task.type(), v1::TASK_TYPE_TRAIN);
  ASSERT_EQ(task_b.task.type(), v1::TASK_TYPE_TRAIN);
  EXPECT_EQ(task_a.task.round(), 1);
  EXPECT_EQ(task_b.task.round(), 1);
  EXPECT_EQ(task_a.weights, initial);
  EXPECT_EQ(Status().phase(), v1::PHASE_TRAINING);

  // a's update is fresh: scale 0.5. b trained the same model, which is one
  // update old by the time it arrives: scale 0.5 / 2.
  auto pushed = a->PushUpdate(Header(1, 100, 2.0),
                              std::vector<float>(NumParameters(), 0.25f));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->round(), 1);
  const std::vector<float> after_a = Applied(initial, 0.5, 0.25f);
  EXPECT_EQ(Global(), after_a);
  pushed = b->PushUpdate(Header(1, 100, 1.0),
                         std::vector<float>(NumParameters(), 0.5f));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->round(), 2);
  const std::vector<float> after_b = Applied(after_a, 0.25, 0.5f);
  EXPECT_EQ(Global(), after_b);

  v1::GetStatusResponse status = Status();
  ASSERT_EQ(status.history_size(), 2);
  EXPECT_EQ(status.history(0).outcome(), "async");
  EXPECT_EQ(status.history(0).staleness(), 0);
  EXPECT_DOUBLE_EQ(status.history(0).update_scale(), 0.5);
  EXPECT_EQ(status.history(0).selected_clients(0), a->client_id());
  EXPECT_EQ(status.history(1).staleness(), 1);
  EXPECT_DOUBLE_EQ(status.history(1).update_scale(), 0.25);
  // The window of min_clients = 2 updates closed: its mean loss is the
  // convergence state (no previous window to compare with yet).
  EXPECT_EQ(status.history(1).relative_improvement(), 0);
  EXPECT_EQ(status.round(), 3);

  // A poll never waits for a round: a gets the latest model at once.
  auto next = NextTask(*a);
  ASSERT_EQ(next.task.type(), v1::TASK_TYPE_TRAIN);
  EXPECT_EQ(next.task.round(), 3);
  EXPECT_EQ(next.weights, after_b);
  pushed = a->PushUpdate(Header(3, 100, 0.5),
                         std::vector<float>(NumParameters(), 1.0f));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(Global(), Applied(after_b, 0.5, 1.0f));

  // max_rounds = 3 updates: the evaluation phase and DONE, as in rounds mode.
  EXPECT_EQ(Status().phase(), v1::PHASE_EVALUATING);
  EXPECT_EQ(Status().stop_reason(), "max_rounds");
  testing::Evaluate(*a, 0.3, 0.9, 50);
  testing::Evaluate(*b, 0.5, 0.7, 50);
  status = Status();
  EXPECT_EQ(status.phase(), v1::PHASE_DONE);
  EXPECT_NEAR(status.final_evaluation().test_accuracy(), 0.8, 1e-12);
}

TEST_F(RunControllerTest, AsyncRejectsStaleRepeatedAndAbandonedUpdates) {
  Start(AsyncRunOfThree([](CoordinatorOptions& o) { o.max_staleness = 1; }));
  auto clients = JoinAll(3);
  CoordinatorClient& a = *clients[0];
  CoordinatorClient& b = *clients[1];
  CoordinatorClient& c = *clients[2];
  const std::vector<float> delta(NumParameters(), 0.1f);
  // Before it was given a task, a push is for a task the client does not hold.
  auto early = a.PushUpdate(Header(0, 100, 2.0), delta);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  for (auto& client : clients) {
    ASSERT_EQ(NextTask(*client).task.round(), 1);
  }
  ASSERT_TRUE(a.PushUpdate(Header(1, 100, 2.0), delta).ok());
  ASSERT_TRUE(b.PushUpdate(Header(1, 100, 2.0), delta).ok());  // 1 stale

  // c's update is 2 updates stale: rejected, and the model is untouched.
  std::vector<float> before = Global();
  auto pushed = c.PushUpdate(Header(1, 100, 2.0), delta);
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(pushed.status().message(), HasSubstr("2 updates stale"));
  EXPECT_EQ(Global(), before);

  // a pushing its round-1 update again: ALREADY_EXISTS, untouched.
  pushed = a.PushUpdate(Header(1, 100, 2.0), delta);
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Global(), before);

  // c takes the latest model (round 3); a's round-3 update is applied; c
  // polls again and so gives its round-3 task up for round 4: an update for
  // round 3 from c is one for a task it no longer holds.
  ASSERT_EQ(NextTask(c).task.round(), 3);
  ASSERT_EQ(NextTask(a).task.round(), 3);
  ASSERT_TRUE(a.PushUpdate(Header(3, 100, 2.0), delta).ok());
  ASSERT_EQ(NextTask(c).task.round(), 4);
  before = Global();
  pushed = c.PushUpdate(Header(3, 100, 2.0), delta);
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(pushed.status().message(), HasSubstr("its task is for round 4"));
  EXPECT_EQ(Global(), before);
  // The task it holds is applied.
  pushed = c.PushUpdate(Header(4, 100, 2.0), delta);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->round(), 4);
  EXPECT_EQ(Status().history_size(), 4);
}

// With a buffer of K, a version takes K clients' updates, one each. A client
// that dies once training started leaves too few alive to fill the buffer:
// the version is made from every alive client's update once the dead one is
// counted gone, rather than never (their polls were held for it).
TEST_F(RunControllerTest, AsyncBufferIsMadeFromEveryAliveClientWhenOneDies) {
  Start(AsyncRunOfThree([](CoordinatorOptions& o) {
    o.async_buffer = 3;
    o.client_timeout = absl::Seconds(1);
  }));
  auto clients = JoinAll(3);
  for (auto& client : clients) ASSERT_EQ(NextTask(*client).task.round(), 1);
  const std::vector<float> initial = Global();
  const std::vector<float> delta(NumParameters(), 0.1f);
  ASSERT_TRUE(clients[0]->PushUpdate(Header(1, 100, 2.0), delta).ok());
  ASSERT_TRUE(clients[1]->PushUpdate(Header(1, 100, 2.0), delta).ok());
  // The third never pushes nor calls again. The two others wait, polling.
  std::vector<CoordinatorClient::ReceivedTask> next(2);
  std::thread first([&] { next[0] = NextTask(*clients[0]); });
  next[1] = NextTask(*clients[1]);
  first.join();
  for (const auto& task : next) {
    EXPECT_EQ(task.task.type(), v1::TASK_TYPE_TRAIN);
    EXPECT_EQ(task.task.round(), 2);
  }
  const v1::GetStatusResponse status = Status();
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).outcome(), "async");
  EXPECT_EQ(status.history(0).responded(), 2);
  EXPECT_NE(Global(), initial);
  EXPECT_EQ(next[0].weights, Global());
}

TEST_F(RunControllerTest, AsyncStopCutsOffUpdatesStillUploading) {
  CoordinatorOptions options = AsyncRun();
  options.max_rounds = 1;
  Start(options);
  auto a = Join();
  auto b = Join();
  ASSERT_EQ(NextTask(*a).task.round(), 1);
  ASSERT_EQ(NextTask(*b).task.round(), 1);
  const std::vector<float> delta(NumParameters(), 0.1f);

  // b's push is admitted (the go-ahead arrives) and then stalls mid-update.
  auto stalled = StallPush(*b, Header(1, 100, 1.0), delta);

  // a's update is the last one training takes: b's upload is cut off at once
  // rather than received in full and then turned away.
  ASSERT_TRUE(a->PushUpdate(Header(1, 100, 1.0), delta).ok());
  EXPECT_EQ(Status().phase(), v1::PHASE_EVALUATING);
  const grpc::Status cut = stalled->Finish();
  EXPECT_EQ(cut.error_code(), grpc::StatusCode::CANCELLED)
      << cut.error_message();
  EXPECT_EQ(Status().history_size(), 1);
}

// With --max_staleness, a push still uploading when the version that makes
// its update too stale is made is cut off then (CANCELLED), not received
// whole and refused at its commit, nor left to its --stall_timeout.
TEST_F(RunControllerTest, AsyncCutsOffAPushThatWentTooStaleWhileUploading) {
  Start(AsyncRunOfThree([](CoordinatorOptions& o) { o.max_staleness = 1; }));
  auto clients = JoinAll(3);
  for (auto& client : clients) ASSERT_EQ(NextTask(*client).task.round(), 1);
  const std::vector<float> delta(NumParameters(), 0.1f);

  // c's push for round 1 is admitted, then stalls after its first chunk.
  auto stalled = StallPush(*clients[2], Header(1, 100, 1.0), delta);

  // Version 1: c's update would be 1 stale at its commit, still applicable.
  ASSERT_TRUE(clients[0]->PushUpdate(Header(1, 100, 1.0), delta).ok());
  // Version 2: it would be 2 stale. Cut off now (the stall timeout is 10 s).
  const absl::Time made = absl::Now();
  ASSERT_TRUE(clients[1]->PushUpdate(Header(1, 100, 1.0), delta).ok());
  const grpc::Status cut = stalled->Finish();
  EXPECT_EQ(cut.error_code(), grpc::StatusCode::CANCELLED)
      << cut.error_message();
  EXPECT_LT(absl::Now() - made, absl::Seconds(5));
  EXPECT_EQ(Status().history_size(), 2);
}

TEST_F(RunControllerTest, AsyncStopsWhenAWindowsLossStopsImproving) {
  CoordinatorOptions options = AsyncRun();
  options.max_rounds = 10;
  options.convergence_threshold = 0.0;  // converged: the loss did not fall
  Start(options);
  auto clients = JoinAll(2);  // a window is 2 updates (2 clients)
  const std::vector<float> delta(NumParameters(), 0.1f);
  int64_t round = 1;
  for (const double loss : {2.0, 1.0, 1.5, 1.7}) {
    CoordinatorClient& client = *clients[round % 2];  // they take turns
    ASSERT_EQ(NextTask(client).task.round(), round);
    ASSERT_TRUE(client.PushUpdate(Header(round, 100, loss), delta).ok());
    ++round;
  }
  const v1::GetStatusResponse status = Status();
  // Windows: (2.0, 1.0) mean 1.5, then (1.5, 1.7) mean 1.6: no improvement.
  EXPECT_EQ(status.phase(), v1::PHASE_EVALUATING);
  EXPECT_EQ(status.stop_reason(), "converged");
  ASSERT_EQ(status.history_size(), 4);
  EXPECT_DOUBLE_EQ(status.history(3).relative_improvement(), (1.5 - 1.6) / 1.5);
  EXPECT_EQ(status.history(2).relative_improvement(), 0);  // mid-window
}

}  // namespace
}  // namespace fedlearn
