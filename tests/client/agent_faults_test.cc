// Agents against coordinators of the tests' own, which script the answers a
// real one gives only under load or faults (a push preempted, cut off or
// unanswered, polls cut off): what the agent keeps, pushes again, drops and
// counts.

#include <grpcpp/server_builder.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/agent.h"
#include "common/model_spec.h"
#include "common/tensor_codec.h"
#include "fedlearn/v1/coordinator.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/client/fake_trainer.h"

namespace fedlearn {
namespace {

using ::fedlearn::testing::FakeFactory;
using ::fedlearn::testing::Script;

// A coordinator of the test's own: answers a join with client-1 of a run of
// mlp_2nn, one epoch of batches of 10; what else it answers is its
// subclass's script.
class ScriptedCoordinator : public v1::Coordinator::Service {
 public:
  grpc::Status Join(grpc::ServerContext*, const v1::JoinRequest*,
                    v1::JoinResponse* response) override {
    response->set_client_id("client-1");
    response->set_session_token("token");
    response->set_run_id("0123456789abcdef");
    *response->mutable_model() = ToProto(spec_);
    response->mutable_plan()->set_epochs(1);
    response->mutable_plan()->set_batch_size(10);
    response->mutable_plan()->set_learning_rate(0.1f);
    response->set_heartbeat_interval_ms(5000);
    return grpc::Status::OK;
  }

 protected:
  const ModelSpec spec_ = *LookupModel("mlp_2nn");
};

// Runs an agent with `options` (its coordinator and name filled in) against
// `coordinator` on a loopback port until Run returns; `agent_done`, if set,
// sees the agent before it goes.
absl::StatusOr<AgentSummary> RunScripted(
    v1::Coordinator::Service& coordinator, AgentOptions options,
    TrainerFactory factory,
    const std::function<void(const Agent&)>& agent_done = nullptr) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&coordinator);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return absl::InternalError("no server");
  options.coordinator = absl::StrCat("127.0.0.1:", port);
  options.display_name = "slow-link";
  options.initial_backoff = absl::Milliseconds(20);
  options.jitter_seed = 1;
  Agent agent(options, std::move(factory));
  absl::StatusOr<AgentSummary> summary = agent.Run();
  if (agent_done) agent_done(agent);
  server->Shutdown();
  return summary;
}

// A coordinator of the test's own, to script answers the real one gives only
// under load or faults: it refuses the first `refusals` pushes with `code`
// (RESOURCE_EXHAUSTED as the real one refuses a push preempted as too slow to
// keep its receive buffer while others wait, CANCELLED as it cuts off a push
// when its round closes or it shuts down, UNAVAILABLE as a proxy answers when
// it lost the coordinator), then accepts one, then says DONE. Each poll before
// that is a TRAIN task of the next round, so an update that is not pushed again
// before the next poll can no longer count.
class RefusingCoordinator final : public ScriptedCoordinator {
 public:
  // `then` is the answer that takes the update: OK, or ALREADY_EXISTS as the
  // real coordinator answers a push whose earlier attempt arrived though the
  // answer to it was lost.
  // With `same_round`, every TRAIN task is round 1 with the same weights, as
  // a coordinator resumed from its state directory asks for a round again.
  RefusingCoordinator(int refusals, grpc::StatusCode code,
                      grpc::StatusCode then = grpc::StatusCode::OK,
                      bool same_round = false)
      : refusals_(refusals),
        code_(code),
        then_(then),
        same_round_(same_round) {}

  grpc::Status RequestUpdate(
      grpc::ServerContext*, const v1::RequestUpdateRequest*,
      grpc::ServerWriter<v1::TaskMessage>* writer) override {
    v1::TaskMessage message;
    v1::Task* task = message.mutable_task();
    {
      absl::MutexLock lock(&mu_);
      if (accepted_ || (done_after_ > 0 && tasks_ >= done_after_)) {
        task->set_type(v1::TASK_TYPE_DONE);
        writer->Write(message);
        return grpc::Status::OK;
      }
      ++tasks_;
      task->set_round(same_round_ ? 1 : tasks_);
    }
    task->set_type(v1::TASK_TYPE_TRAIN);
    task->set_num_tensors(static_cast<int32_t>(spec_.tensors.size()));
    writer->Write(message);
    const std::vector<float> weights(spec_.num_parameters, 0.5f);
    ChunkWriter chunks(spec_, weights, 64 << 10);
    v1::TaskMessage chunk;
    while (chunks.Next(chunk.mutable_chunk())) writer->Write(chunk);
    return grpc::Status::OK;
  }

  grpc::Status PushGradient(grpc::ServerContext*,
                            grpc::ServerReader<v1::PushGradientRequest>* reader,
                            v1::PushGradientResponse*) override {
    // The go-ahead the agent waits for before it sends its chunks.
    reader->SendInitialMetadata();
    v1::PushGradientRequest message;
    int64_t round = 0;
    while (reader->Read(&message)) {
      if (message.has_header()) round = message.header().round();
    }
    absl::MutexLock lock(&mu_);
    pushed_rounds_.push_back(round);
    if (static_cast<int>(pushed_rounds_.size()) <= refusals_) {
      return grpc::Status(code_, "client client-1: scripted refusal");
    }
    accepted_ = true;
    if (then_ == grpc::StatusCode::OK) return grpc::Status::OK;
    return grpc::Status(then_,
                        "client client-1: update for round already "
                        "applied");
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    return grpc::Status::OK;
  }

  // The round of each push's header, in order.
  std::vector<int64_t> pushed_rounds() {
    absl::MutexLock lock(&mu_);
    return pushed_rounds_;
  }
  // DONE once `tasks` TRAIN tasks were handed out, taken or not.
  void DoneAfter(int tasks) {
    absl::MutexLock lock(&mu_);
    done_after_ = tasks;
  }
  // TRAIN tasks handed out.
  int64_t tasks() {
    absl::MutexLock lock(&mu_);
    return tasks_;
  }

 private:
  const int refusals_;
  const grpc::StatusCode code_;
  const grpc::StatusCode then_;
  const bool same_round_;
  absl::Mutex mu_;
  int64_t tasks_ ABSL_GUARDED_BY(mu_) = 0;
  int done_after_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> pushed_rounds_ ABSL_GUARDED_BY(mu_);
  bool accepted_ ABSL_GUARDED_BY(mu_) = false;
};

// Runs one agent against `coordinator` to DONE; counts its trainings.
absl::StatusOr<AgentSummary> RunAgainst(RefusingCoordinator& coordinator,
                                        int max_repeated_errors,
                                        std::atomic<int>* trainings,
                                        bool* holds_update_values) {
  AgentOptions options;
  options.max_backoff = absl::Milliseconds(200);
  options.max_repeated_errors = max_repeated_errors;
  Script script;
  script.on_train = [trainings](int, const ProgressFn&) { ++*trainings; };
  return RunScripted(coordinator, options, FakeFactory(script),
                     [holds_update_values](const Agent& agent) {
                       *holds_update_values = agent.HoldsUpdateValues();
                     });
}

// "Not now" (a push preempted as too slow while others waited), or no answer
// from the same coordinator: the update is pushed again as it is, before any
// poll, so it still counts for its round (a poll would hand out a newer task:
// in async mode always) and is not trained again.
class AgentPushAgainTest : public ::testing::TestWithParam<grpc::StatusCode> {};

TEST_P(AgentPushAgainTest, TheSameUpdateIsPushedAgainBeforeAnyPoll) {
  RefusingCoordinator coordinator(/*refusals=*/2, GetParam());
  std::atomic<int> trainings{0};
  bool holds = true;
  absl::StatusOr<AgentSummary> summary =
      RunAgainst(coordinator, /*max_repeated_errors=*/3, &trainings, &holds);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(coordinator.pushed_rounds(), std::vector<int64_t>({1, 1, 1}));
  EXPECT_EQ(coordinator.tasks(), 1);
  EXPECT_EQ(trainings.load(), 1);
  EXPECT_EQ(summary->rounds_trained, 1);
  EXPECT_EQ(summary->updates_rejected, 0);
  EXPECT_FALSE(holds);  // pushed, then wiped
}

INSTANTIATE_TEST_SUITE_P(Codes, AgentPushAgainTest,
                         ::testing::Values(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                           grpc::StatusCode::UNAVAILABLE));

// A push the coordinator cut off (CANCELLED: its round closed at quorum, or
// the coordinator shut down) is kept, and the next task decides: the same
// round with the same weights (a coordinator resumed from its state
// directory) gets it again without training; another round trains afresh,
// and the kept update counts as rejected. No push is made only to be told
// the round closed.
TEST(AgentPushTest, APushCutOffIsKeptForTheNextTaskToDecide) {
  for (const bool same_round : {true, false}) {
    RefusingCoordinator coordinator(/*refusals=*/1, grpc::StatusCode::CANCELLED,
                                    grpc::StatusCode::OK, same_round);
    std::atomic<int> trainings{0};
    bool holds = true;
    absl::StatusOr<AgentSummary> summary =
        RunAgainst(coordinator, /*max_repeated_errors=*/3, &trainings, &holds);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(coordinator.pushed_rounds(), same_round
                                               ? std::vector<int64_t>({1, 1})
                                               : std::vector<int64_t>({1, 2}));
    EXPECT_EQ(coordinator.tasks(), 2);
    EXPECT_EQ(trainings.load(), same_round ? 1 : 2);
    EXPECT_EQ(summary->rounds_trained, 1);
    EXPECT_EQ(summary->updates_rejected, same_round ? 0 : 1);
    EXPECT_FALSE(holds);
  }
  // DONE next: dropped, counted, and its values wiped.
  RefusingCoordinator coordinator(/*refusals=*/1, grpc::StatusCode::CANCELLED);
  coordinator.DoneAfter(1);
  std::atomic<int> trainings{0};
  bool holds = true;
  absl::StatusOr<AgentSummary> summary =
      RunAgainst(coordinator, /*max_repeated_errors=*/3, &trainings, &holds);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(coordinator.pushed_rounds(), std::vector<int64_t>({1}));
  EXPECT_EQ(summary->rounds_trained, 0);
  EXPECT_EQ(summary->updates_rejected, 1);
  EXPECT_FALSE(holds);
}

// A push that went unanswered may have arrived all the same: ALREADY_EXISTS to
// the attempt after it means it did, and the update counts as pushed (as the
// Python SDK counts it), not as rejected.
TEST(AgentPushTest, AlreadyExistsAfterAnUnansweredAttemptIsAPush) {
  RefusingCoordinator coordinator(/*refusals=*/1, grpc::StatusCode::UNAVAILABLE,
                                  /*then=*/grpc::StatusCode::ALREADY_EXISTS);
  std::atomic<int> trainings{0};
  bool holds = true;
  absl::StatusOr<AgentSummary> summary =
      RunAgainst(coordinator, /*max_repeated_errors=*/3, &trainings, &holds);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(coordinator.pushed_rounds(), std::vector<int64_t>({1, 1}));
  EXPECT_EQ(summary->rounds_trained, 1);
  EXPECT_EQ(summary->updates_rejected, 0);
}

// Refused "not now" max_repeated_errors times in a row, the update is dropped
// and counted, and the agent carries on with the next task (README, as the
// Python SDK does): a client on a slow link is not ended by its refusals.
TEST(AgentPushTest, AnUpdateRefusedTooOftenIsDroppedAndTheAgentCarriesOn) {
  RefusingCoordinator coordinator(/*refusals=*/5,
                                  grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::atomic<int> trainings{0};
  bool holds = true;
  absl::StatusOr<AgentSummary> summary =
      RunAgainst(coordinator, /*max_repeated_errors=*/3, &trainings, &holds);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(coordinator.pushed_rounds(),
            std::vector<int64_t>({1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(trainings.load(), 2);
  EXPECT_EQ(summary->updates_rejected, 1);
  EXPECT_EQ(summary->rounds_trained, 1);
  EXPECT_FALSE(holds);  // what was refused is wiped
}

// A coordinator that cuts off every poll (CANCELLED, as the real one cuts off
// a download that stalls or goes too stale on a slow link) until `until`,
// then says DONE.
class CuttingCoordinator final : public ScriptedCoordinator {
 public:
  explicit CuttingCoordinator(absl::Time until) : until_(until) {}

  grpc::Status RequestUpdate(
      grpc::ServerContext*, const v1::RequestUpdateRequest*,
      grpc::ServerWriter<v1::TaskMessage>* writer) override {
    if (absl::Now() < until_) {
      cut_.fetch_add(1);
      return grpc::Status(grpc::StatusCode::CANCELLED,
                          "client client-1: download cut off");
    }
    v1::TaskMessage message;
    message.mutable_task()->set_type(v1::TASK_TYPE_DONE);
    writer->Write(message);
    return grpc::Status::OK;
  }

  int cut() const { return cut_.load(); }

 private:
  const absl::Time until_;
  std::atomic<int> cut_{0};
};

// Cut off again and again for longer than reconnect_timeout, the agent goes
// on: the coordinator answered every time, so it is not "no answer".
TEST(AgentPollTest, PollsCutOffByTheCoordinatorAreNotSilence) {
  CuttingCoordinator coordinator(absl::Now() + absl::Milliseconds(1500));
  AgentOptions options;
  options.max_backoff = absl::Milliseconds(100);
  options.reconnect_timeout = absl::Seconds(1);
  absl::StatusOr<AgentSummary> summary =
      RunScripted(coordinator, options, FakeFactory(Script()));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_GE(coordinator.cut(), 5);
}

}  // namespace
}  // namespace fedlearn
