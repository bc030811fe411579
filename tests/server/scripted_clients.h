#ifndef FEDLEARN_TESTS_SERVER_SCRIPTED_CLIENTS_H_
#define FEDLEARN_TESTS_SERVER_SCRIPTED_CLIENTS_H_

// Helpers for tests that drive a real coordinator with scripted clients
// (CoordinatorClient, the agent's own RPC layer) pushing hand-made updates.

#include <grpcpp/create_channel.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/options.h"

namespace fedlearn::testing {

constexpr absl::Duration kWait = absl::Seconds(20);  // upper bound, never slept

// A small run: mlp_2nn (199,210 parameters, quick to move around), 3 clients a
// round, 3 rounds, validation every 2nd, no convergence before a rising loss.
inline CoordinatorOptions SmallRun() {
  CoordinatorOptions o;
  o.model = "mlp_2nn";
  o.seed = 7;
  o.min_clients = 3;
  o.clients_per_round = 3;
  o.max_rounds = 3;
  o.round_timeout = absl::Seconds(30);
  o.eval_timeout = absl::Seconds(30);
  o.convergence_threshold = 0.0;
  o.rounds_between_validations = 2;
  return o;
}

// Starts a coordinator with `options` on a free loopback port into `*server`
// and returns a channel to it that takes 4 MB messages.
inline std::shared_ptr<grpc::Channel> StartCoordinator(
    const CoordinatorOptions& options,
    std::unique_ptr<CoordinatorServer>* server) {
  auto started = CoordinatorServer::Start(options, "127.0.0.1:0");
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return nullptr;
  *server = *std::move(started);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(4 << 20);
  return grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", (*server)->port()),
      grpc::InsecureChannelCredentials(), args);
}

inline v1::UpdateHeader Header(int64_t round, int64_t examples, double loss) {
  v1::UpdateHeader h;
  h.set_round(round);
  h.set_num_examples(examples);
  h.set_train_loss(loss);
  h.set_train_accuracy(0.5);
  return h;
}

// Polls until the client gets a task other than WAIT.
inline CoordinatorClient::ReceivedTask NextTask(CoordinatorClient& client) {
  const absl::Time deadline = absl::Now() + kWait;
  while (absl::Now() < deadline) {
    auto task = client.RequestUpdate(absl::Seconds(5));
    EXPECT_TRUE(task.ok()) << task.status();
    if (!task.ok()) break;
    if (task->task.type() != v1::TASK_TYPE_WAIT) return *std::move(task);
  }
  ADD_FAILURE() << client.client_id() << " got no task";
  return {};
}

// Takes the client's next task, which must be TRAIN for `round`, and pushes a
// delta of `value` in every parameter (100 examples, train loss 2 / round).
// Returns the task.
inline CoordinatorClient::ReceivedTask TrainConstant(CoordinatorClient& client,
                                                     int64_t round,
                                                     float value) {
  CoordinatorClient::ReceivedTask task = NextTask(client);
  EXPECT_EQ(task.task.type(), v1::TASK_TYPE_TRAIN);
  EXPECT_EQ(task.task.round(), round);
  const std::vector<float> delta(task.weights.size(), value);
  const auto pushed = client.PushUpdate(Header(round, 100, 2.0 / round), delta);
  EXPECT_TRUE(pushed.ok()) << pushed.status();
  return task;
}

// Takes the client's next task, which must be EVALUATE, and reports these
// metrics for it. Returns the task.
inline CoordinatorClient::ReceivedTask Evaluate(CoordinatorClient& client,
                                                double loss, double accuracy,
                                                int64_t examples) {
  CoordinatorClient::ReceivedTask task = NextTask(client);
  EXPECT_EQ(task.task.type(), v1::TASK_TYPE_EVALUATE);
  v1::ReportEvalRequest report;
  report.set_round(task.task.round());
  report.set_test_loss(loss);
  report.set_test_accuracy(accuracy);
  report.set_num_examples(examples);
  const absl::Status reported = client.ReportEval(report);
  EXPECT_TRUE(reported.ok()) << reported;
  return task;
}

}  // namespace fedlearn::testing

#endif  // FEDLEARN_TESTS_SERVER_SCRIPTED_CLIENTS_H_
