// The run controller computes each new global model into the buffer of the
// model two versions back once nothing holds that any more (a fresh
// model-sized block costs a page fault per page under the lock). What users
// rely on: a model someone still holds (here a snapshot from global_weights(),
// as a download, a save or the HTTP model endpoint holds one) never changes
// under them, and every round's model is exactly the step from the one
// before, whatever buffer it lands in.

#include <memory>
#include <vector>

#include "client/coordinator_client.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/run_controller.h"
#include "tests/server/scripted_clients.h"

namespace fedlearn {
namespace {

using testing::SmallRun;
using testing::StartCoordinator;
using testing::TrainConstant;

// FedAvg's step with the default server learning rate of 1 when the only
// update of a round is `delta` in every parameter.
std::vector<float> Stepped(const std::vector<float>& model, float delta) {
  std::vector<float> next(model.size());
  for (size_t i = 0; i < model.size(); ++i) {
    next[i] = static_cast<float>(static_cast<double>(model[i]) +
                                 static_cast<double>(delta));
  }
  return next;
}

TEST(ModelBuffersTest, AHeldModelNeverChangesAndEveryRoundStepsExactly) {
  CoordinatorOptions options = SmallRun();
  options.min_clients = 1;
  options.clients_per_round = 1;
  options.max_rounds = 5;
  options.rounds_between_validations = 100;
  std::unique_ptr<CoordinatorServer> server;
  auto channel = StartCoordinator(options, &server);
  ASSERT_NE(channel, nullptr);
  CoordinatorClient client(channel);
  ASSERT_TRUE(client.Join(v1::JoinRequest()).ok());

  std::vector<float> expected = *server->controller().global_weights();
  const float deltas[] = {0.5f, -0.25f, 0.125f, 1.0f};
  // Held from round 1 to the end: without it, round 3 would be computed into
  // this very buffer.
  Weights held;
  std::vector<float> held_values;
  for (int round = 1; round <= 4; ++round) {
    TrainConstant(client, round, deltas[round - 1]);
    expected = Stepped(expected, deltas[round - 1]);
    const Weights now = server->controller().global_weights();
    ASSERT_EQ(*now, expected) << "round " << round;
    if (round == 1) {
      held = now;
      held_values = *now;
    }
  }
  EXPECT_EQ(*held, held_values);
}

}  // namespace
}  // namespace fedlearn
