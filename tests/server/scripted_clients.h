#ifndef FEDLEARN_TESTS_SERVER_SCRIPTED_CLIENTS_H_
#define FEDLEARN_TESTS_SERVER_SCRIPTED_CLIENTS_H_

// Helpers for tests that drive a real coordinator with scripted clients
// (CoordinatorClient, the agent's own RPC layer) pushing hand-made updates.

#include <grpcpp/create_channel.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "common/tensor_codec.h"
#include "fedlearn/v1/coordinator.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/options.h"
#include "server/run_controller.h"

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

// A fixture for tests of a whole run over the service: a coordinator started
// per test (Start) and scripted clients joined to it, with helpers for the
// patterned round-1 pushes whose FedAvg mean the tests compute by hand.
class ServiceTest : public ::testing::Test {
 protected:
  void Start(const CoordinatorOptions& options) {
    channel_ = testing::StartCoordinator(options, &server_);
    ASSERT_NE(channel_, nullptr);
  }

  std::unique_ptr<CoordinatorClient> Join(const std::string& join_token = "") {
    auto client = std::make_unique<CoordinatorClient>(channel_);
    v1::JoinRequest request;
    request.set_join_token(join_token);
    auto joined = client->Join(request);
    EXPECT_TRUE(joined.ok()) << joined.status();
    return client;
  }

  std::vector<std::unique_ptr<CoordinatorClient>> JoinAll(int n) {
    std::vector<std::unique_ptr<CoordinatorClient>> clients;
    for (int i = 0; i < n; ++i) clients.push_back(Join());
    return clients;
  }

  CoordinatorClient::ReceivedTask NextTask(CoordinatorClient& client) {
    return testing::NextTask(client);
  }

  std::vector<float> Global() {
    return *server_->controller().global_weights();
  }
  // The run's status with the records' client ids.
  v1::GetStatusResponse Status() {
    return server_->controller().GetStatus(
        ClientPage(), nullptr, kDefaultHistory, /*client_ids=*/true);
  }
  size_t NumParameters() { return server_->controller().spec().num_parameters; }

  // Round 1 for three clients: client i pushes deltas[i] * (j % 5 - 2) for
  // parameter j (so that the aggregate differs per parameter), with
  // examples[i] and train loss first_loss + i.
  // With `encoded_first`, client 0 sends its update cut into chunk messages
  // beforehand (PushEncoded) instead of PushUpdate.
  void PushPatterned(
      const std::vector<std::unique_ptr<CoordinatorClient>>& clients,
      const int64_t (&examples)[3], const float (&deltas)[3], double first_loss,
      bool encoded_first = false) {
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(NextTask(*clients[i]).task.type(), v1::TASK_TYPE_TRAIN);
      std::vector<float> delta(NumParameters());
      for (size_t j = 0; j < delta.size(); ++j) {
        delta[j] = deltas[i] * static_cast<float>(static_cast<int>(j % 5) - 2);
      }
      const v1::UpdateHeader header = Header(1, examples[i], first_loss + i);
      if (encoded_first && i == 0) {
        std::vector<v1::PushGradientRequest> chunks =
            Messages(*clients[i], header, delta);
        chunks.erase(chunks.begin());  // PushEncoded sends the header itself
        ASSERT_TRUE(clients[i]->PushEncoded(header, chunks).ok());
      } else {
        ASSERT_TRUE(clients[i]->PushUpdate(header, delta).ok());
      }
    }
  }

  // The global model after PushPatterned from `before`: the example-weighted
  // mean of the three updates, computed in double from their float values.
  void ExpectPatternedMean(const std::vector<float>& before,
                           const int64_t (&examples)[3],
                           const float (&deltas)[3]) {
    const std::vector<float> after = Global();
    ASSERT_EQ(after.size(), before.size());
    const double total =
        static_cast<double>(examples[0] + examples[1] + examples[2]);
    for (size_t j = 0; j < after.size(); ++j) {
      const float k = static_cast<float>(static_cast<int>(j % 5) - 2);
      double sum = 0;
      for (int i = 0; i < 3; ++i) {
        sum += static_cast<double>(examples[i]) * double{deltas[i] * k};
      }
      ASSERT_EQ(after[j], static_cast<float>(double{before[j]} + sum / total))
          << j;
    }
  }

  // A valid push message list whose first chunk has been altered by `mutate`.
  std::vector<v1::PushGradientRequest> Messages(
      const CoordinatorClient& client, const v1::UpdateHeader& header,
      const std::vector<float>& delta,
      const std::function<void(v1::TensorChunk*)>& mutate = nullptr) {
    std::vector<v1::PushGradientRequest> messages(1);
    *messages[0].mutable_header() = header;
    messages[0].mutable_header()->set_client_id(client.client_id());
    ChunkWriter writer(client.spec(), delta, 64 << 10);
    v1::PushGradientRequest m;
    while (writer.Next(m.mutable_chunk())) messages.push_back(m);
    if (mutate) mutate(messages[1].mutable_chunk());
    return messages;
  }

  // A push by `client` that was admitted (its go-ahead arrived) and then
  // stalls after its first chunk; Finish waits for the coordinator to end it.
  struct StalledPush {
    grpc::ClientContext context;
    v1::PushGradientResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::PushGradientRequest>> writer;
    grpc::Status Finish() { return writer->Finish(); }
  };
  std::unique_ptr<StalledPush> StallPush(CoordinatorClient& client,
                                         const v1::UpdateHeader& header,
                                         const std::vector<float>& delta) {
    auto push = std::make_unique<StalledPush>();
    auto stub = v1::Coordinator::NewStub(channel_);
    push->context.AddMetadata("authorization",
                              "Bearer " + client.session_token());
    push->context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    push->writer = stub->PushGradient(&push->context, &push->response);
    const auto messages = Messages(client, header, delta);
    EXPECT_TRUE(push->writer->Write(messages[0]));
    push->writer->WaitForInitialMetadata();
    EXPECT_TRUE(push->writer->Write(messages[1]));
    return push;
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace fedlearn::testing

#endif  // FEDLEARN_TESTS_SERVER_SCRIPTED_CLIENTS_H_
