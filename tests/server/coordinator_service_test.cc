// Full runs of the coordinator over real gRPC on a loopback socket, driven by
// scripted clients (CoordinatorClient, the agent's own RPC layer) that push
// hand-made updates.

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "common/crc32c.h"
#include "common/model_spec.h"
#include "common/safetensors.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/run_controller.h"
#include "tests/server/scripted_clients.h"
#include "tests/util/files.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;

using testing::Header;
using testing::kWait;
using testing::SmallRun;

class CoordinatorServiceTest : public ::testing::Test {
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

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(CoordinatorServiceTest, RunsFromWaitingToDone) {
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

TEST(CoordinatorSamplingTest, SameSeedAndNamesSampleAlikeWhateverTheJoinOrder) {
  const std::vector<std::string> names =
      SampledNames({"a", "b", "c", "d", "e"});
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(SampledNames({"e", "c", "a", "d", "b"}), names);
  EXPECT_EQ(SampledNames({"d", "e", "b", "c", "a"}), names);
}

// Also with client 0's update cut into chunk messages beforehand and sent by
// PushEncoded, as a load generator sends it: it counts like any other.
TEST_F(CoordinatorServiceTest, FedAvgIsTheExampleWeightedMean) {
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

TEST_F(CoordinatorServiceTest,
       RoundClosesAtQuorumWithoutWaitingForTheDeadline) {
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

TEST_F(CoordinatorServiceTest,
       RoundBelowQuorumAtDeadlineIsRetriedWithANewSample) {
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
TEST_F(CoordinatorServiceTest, MedianIgnoresAnOutlierInMemoryOrSpilled) {
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

TEST_F(CoordinatorServiceTest, RejectedUpdatesLeaveTheModelBitIdentical) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 3;
  o.clients_per_round = 2;  // one of the three is not selected
  Start(o);
  auto clients = JoinAll(3);
  std::vector<CoordinatorClient*> selected;
  CoordinatorClient* unselected = nullptr;
  for (auto& c : clients) {
    auto task = c->RequestUpdate(absl::Milliseconds(1));
    ASSERT_TRUE(task.ok());
    if (task->task.type() == v1::TASK_TYPE_TRAIN) {
      selected.push_back(c.get());
    } else {
      unselected = c.get();
    }
  }
  ASSERT_EQ(selected.size(), 2u);
  ASSERT_NE(unselected, nullptr);
  CoordinatorClient& a = *selected[0];
  const std::vector<float> before = Global();
  const std::vector<float> good(NumParameters(), 0.25f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();

  struct Case {
    std::string name;
    absl::StatusCode code;
    std::function<absl::Status()> push;
  };
  auto raw = [&](std::function<void(v1::TensorChunk*)> mutate,
                 std::vector<float> delta) {
    return [&a, this, mutate, delta] {
      return a.PushMessages(Messages(a, Header(1, 10, 1.0), delta, mutate))
          .status();
    };
  };
  std::vector<float> with_nan = good;
  with_nan[12345] = nan;
  std::vector<float> with_inf = good;
  with_inf[NumParameters() - 1] = inf;
  const std::vector<Case> cases = {
      {"stale round", absl::StatusCode::kFailedPrecondition,
       [&] { return a.PushUpdate(Header(2, 10, 1.0), good).status(); }},
      {"not selected", absl::StatusCode::kFailedPrecondition,
       [&] {
         return unselected->PushUpdate(Header(1, 10, 1.0), good).status();
       }},
      {"zero examples", absl::StatusCode::kInvalidArgument,
       [&] { return a.PushUpdate(Header(1, 0, 1.0), good).status(); }},
      // Two such claims would overflow the round's int64 example count.
      {"more examples than any data set", absl::StatusCode::kInvalidArgument,
       [&] {
         return a.PushUpdate(Header(1, (int64_t{1} << 40) + 1, 1.0), good)
             .status();
       }},
      {"NaN loss", absl::StatusCode::kInvalidArgument,
       [&] { return a.PushUpdate(Header(1, 10, nan), good).status(); }},
      {"dense chunks under a quantized header",
       absl::StatusCode::kInvalidArgument,
       [&] {
         v1::UpdateHeader h = Header(1, 10, 1.0);
         h.set_encoding(v1::ENCODING_QUANTIZED);
         return a.PushMessages(Messages(a, h, good)).status();
       }},
      {"sparse encoding (reserved)", absl::StatusCode::kInvalidArgument,
       [&] {
         v1::UpdateHeader h = Header(1, 10, 1.0);
         h.set_encoding(v1::ENCODING_SPARSE_TOPK);
         return a.PushMessages(Messages(a, h, good)).status();
       }},
      {"train accuracy above 1", absl::StatusCode::kInvalidArgument,
       [&] {
         v1::UpdateHeader h = Header(1, 10, 1.0);
         h.set_train_accuracy(1.5);
         return a.PushUpdate(h, good).status();
       }},
      {"negative validation accuracy", absl::StatusCode::kInvalidArgument,
       [&] {
         v1::UpdateHeader h = Header(1, 10, 1.0);
         h.set_num_validation_examples(5);
         h.set_validation_accuracy(-0.1);
         return a.PushUpdate(h, good).status();
       }},
      {"wrong shape", absl::StatusCode::kInvalidArgument,
       raw([](v1::TensorChunk* c) { c->set_shape(0, c->shape(0) + 1); }, good)},
      {"wrong dtype", absl::StatusCode::kInvalidArgument,
       raw([](v1::TensorChunk* c) { c->set_dtype(v1::DTYPE_FLOAT16); }, good)},
      {"wrong size", absl::StatusCode::kInvalidArgument,
       raw([](v1::TensorChunk* c) { c->set_total_bytes(c->total_bytes() - 4); },
           good)},
      {"bad checksum", absl::StatusCode::kInvalidArgument,
       raw([](v1::TensorChunk* c) { (*c->mutable_data())[100] ^= 1; }, good)},
      {"NaN value", absl::StatusCode::kInvalidArgument, raw(nullptr, with_nan)},
      {"Inf value", absl::StatusCode::kInvalidArgument, raw(nullptr, with_inf)},
      {"truncated", absl::StatusCode::kInvalidArgument,
       [&] {
         auto m = Messages(a, Header(1, 10, 1.0), good);
         m.pop_back();
         return a.PushMessages(m).status();
       }},
      {"no header", absl::StatusCode::kInvalidArgument,
       [&] {
         auto m = Messages(a, Header(1, 10, 1.0), good);
         m.erase(m.begin());
         return a.PushMessages(m).status();
       }},
      {"empty push", absl::StatusCode::kInvalidArgument,
       [&] { return a.PushMessages({}).status(); }},
  };
  for (const Case& c : cases) {
    absl::Status s = c.push();
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s;
    // Every error names the client it is for, a push without a header too.
    const CoordinatorClient* by = c.name == "not selected" ? unselected : &a;
    EXPECT_THAT(s.message(),
                HasSubstr(absl::StrCat("client ", by->client_id())))
        << c.name;
    ASSERT_EQ(0, std::memcmp(Global().data(), before.data(),
                             before.size() * sizeof(float)))
        << c.name << " changed the global model";
    EXPECT_EQ(Status().history_size(), 0) << c.name;
  }

  // The round still works, and nothing of the rejected pushes leaked into the
  // average: two valid updates of 0.25 move every weight by exactly 0.25.
  ASSERT_TRUE(a.PushUpdate(Header(1, 10, 1.0), good).ok());
  auto duplicate = a.PushUpdate(Header(1, 10, 1.0), good);
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Global(), before);
  ASSERT_TRUE(selected[1]->PushUpdate(Header(1, 30, 1.0), good).ok());
  const std::vector<float> after = Global();
  for (size_t j = 0; j < after.size(); ++j) {
    ASSERT_EQ(after[j], static_cast<float>(double{before[j]} + double{0.25f}))
        << j;
  }
  const v1::RejectionCounts r = Status().history(0).rejected();
  EXPECT_EQ(r.stale_round(), 1);
  EXPECT_EQ(r.not_selected(), 1);
  EXPECT_EQ(r.duplicate(), 1);
  EXPECT_EQ(r.invalid(), 13);
  EXPECT_EQ(r.incomplete(), 1);
}

TEST_F(CoordinatorServiceTest,
       QuantizedUpdatesMoveTheModelByTheirDecodedValues) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 2;
  o.clients_per_round = 2;
  o.tolerance = 0;  // both updates count
  Start(o);
  auto clients = JoinAll(2);
  for (auto& c : clients) ASSERT_EQ(NextTask(*c).task.round(), 1);
  const std::vector<float> before = Global();
  // Per tensor: values spread over (-1, 1) times a tensor-specific size.
  const ModelSpec& spec = clients[0]->spec();
  std::vector<float> delta(NumParameters());
  for (const TensorSpec& t : spec.tensors) {
    for (int64_t i = 0; i < t.num_elements; ++i) {
      delta[t.offset + i] = std::sin(0.1f * i) * (1 + t.offset % 7);
    }
  }
  // What the coordinator should decode: the codec's own round trip.
  std::vector<float> decoded(delta.size());
  {
    ChunkWriter writer(spec, delta, 64 << 10, v1::ENCODING_QUANTIZED);
    ChunkAssembler assembler(spec, absl::MakeSpan(decoded), true,
                             kMaxChunkBytes, v1::ENCODING_QUANTIZED);
    v1::TensorChunk chunk;
    while (writer.Next(&chunk)) ASSERT_TRUE(assembler.Add(chunk).ok());
    ASSERT_TRUE(assembler.Finish().ok());
  }
  ASSERT_NE(decoded, delta);  // int8 is lossy
  v1::UpdateHeader header = Header(1, 10, 1.0);
  header.set_encoding(v1::ENCODING_QUANTIZED);
  for (auto& c : clients) ASSERT_TRUE(c->PushUpdate(header, delta).ok());
  const std::vector<float> after = Global();
  for (size_t j = 0; j < after.size(); ++j) {
    ASSERT_EQ(after[j], static_cast<float>(double{before[j]} + decoded[j]))
        << j;
  }
  // A quarter of the dense bytes, plus a scale per tensor, per update.
  const int64_t quantized_bytes =
      static_cast<int64_t>(NumParameters() + 4 * spec.tensors.size());
  EXPECT_EQ(Status().history(0).bytes_received(), 2 * quantized_bytes);
}

TEST_F(CoordinatorServiceTest, OversizedChunkIsResourceExhausted) {
  Start(SmallRun());
  auto clients = JoinAll(3);
  CoordinatorClient& a = *clients[0];
  ASSERT_EQ(NextTask(a).task.type(), v1::TASK_TYPE_TRAIN);
  const std::vector<float> before = Global();
  // fc1.weight is 627,200 bytes; pretend it is one 2 MiB chunk.
  auto messages =
      Messages(a, Header(1, 10, 1.0), std::vector<float>(NumParameters()),
               [](v1::TensorChunk* c) { c->mutable_data()->resize(2 << 20); });
  EXPECT_EQ(a.PushMessages(messages).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Global(), before);
}

TEST_F(CoordinatorServiceTest, ConvergenceStartsTheEvaluationPhase) {
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

TEST_F(CoordinatorServiceTest, MaxRoundsStopsTraining) {
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

TEST_F(CoordinatorServiceTest, EvaluationIsWeightedByTestSizeWithTolerance) {
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

// GetStatus lists the clients a page at a time (100 by default, at most
// 1000), in join order, and counts every one of them.
TEST_F(CoordinatorServiceTest, GetStatusPagesTheClientListAndCountsThemAll) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 1000;  // nobody trains: all 250 stay ready
  Start(o);
  auto clients = JoinAll(250);
  auto stub = v1::Coordinator::NewStub(channel_);
  auto get = [&](int size, const std::string& token,
                 v1::GetStatusResponse* reply) {
    grpc::ClientContext context;
    v1::GetStatusRequest request;
    request.set_client_page_size(size);
    request.set_client_page_token(token);
    return stub->GetStatus(&context, request, reply);
  };
  v1::GetStatusResponse reply;
  ASSERT_TRUE(get(0, "", &reply).ok());
  EXPECT_EQ(reply.clients_size(), 100);
  EXPECT_EQ(reply.clients(0).client_id(), clients[0]->client_id());
  EXPECT_EQ(reply.client_counts().joined(), 250);
  EXPECT_EQ(reply.client_counts().ready(), 250);
  EXPECT_FALSE(reply.next_client_page_token().empty());

  // Pages of 120 cover every client once, in join order.
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    ASSERT_TRUE(get(120, token, &reply).ok());
    for (const v1::ClientInfo& c : reply.clients())
      seen.push_back(c.client_id());
    token = reply.next_client_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  ASSERT_EQ(seen.size(), 250u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i], clients[i]->client_id()) << i;
  }
  // Above the maximum, a page holds 1000.
  ASSERT_TRUE(get(5000, "", &reply).ok());
  EXPECT_EQ(reply.clients_size(), 250);
  EXPECT_TRUE(reply.next_client_page_token().empty());

  grpc::Status bad = get(-1, "", &reply);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("client_page_size -1"));
  for (const char* token : {"abc", "-5", "007", "1e3"}) {
    bad = get(10, token, &reply);
    EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << token;
    EXPECT_THAT(bad.error_message(),
                HasSubstr("is not one a status reply gave"));
  }
  // A token past the end is an empty last page.
  ASSERT_TRUE(get(10, "100000", &reply).ok());
  EXPECT_EQ(reply.clients_size(), 0);
  EXPECT_EQ(reply.client_counts().joined(), 250);
}

// Clients gone for --forget_after leave the status and must join again, so
// that clients joining and leaving cost memory for that long only; a page
// token taken before they went still pages on from where it left off.
TEST_F(CoordinatorServiceTest, ForgottenClientsLeaveTheListAndMustJoinAgain) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 1000;  // nobody trains
  o.client_timeout = absl::Milliseconds(300);
  o.forget_after = absl::Milliseconds(600);
  Start(o);
  auto clients = JoinAll(4);  // 0 and 1 fall silent, 2 and 3 heartbeat
  auto stub = v1::Coordinator::NewStub(channel_);
  auto get = [&](int size, const std::string& token) {
    grpc::ClientContext context;
    v1::GetStatusRequest request;
    request.set_client_page_size(size);
    request.set_client_page_token(token);
    v1::GetStatusResponse reply;
    EXPECT_TRUE(stub->GetStatus(&context, request, &reply).ok());
    return reply;
  };
  const std::string token = get(1, "").next_client_page_token();
  ASSERT_FALSE(token.empty());  // from clients[1] on

  v1::GetStatusResponse reply;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  do {
    for (int i : {2, 3}) ASSERT_TRUE(clients[i]->Heartbeat({}).ok());
    absl::SleepFor(absl::Milliseconds(100));
    reply = get(10, "");
  } while (reply.clients_size() > 2 && absl::Now() < give_up);
  ASSERT_EQ(reply.clients_size(), 2);
  EXPECT_EQ(reply.clients(0).client_id(), clients[2]->client_id());
  EXPECT_EQ(reply.clients(1).client_id(), clients[3]->client_id());
  EXPECT_EQ(reply.client_counts().joined(), 4);  // forgotten ones included
  EXPECT_EQ(reply.client_counts().gone(), 2);
  EXPECT_EQ(reply.client_counts().ready(), 2);
  // The old token resumes at the first client still remembered after it.
  reply = get(1, token);
  ASSERT_EQ(reply.clients_size(), 1);
  EXPECT_EQ(reply.clients(0).client_id(), clients[2]->client_id());

  // A forgotten client's call is told to join again; its id is not reused.
  absl::StatusOr<v1::HeartbeatResponse> beat = clients[0]->Heartbeat({});
  EXPECT_EQ(beat.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(beat.status().message(), HasSubstr("join again"));
  EXPECT_EQ(Join()->client_id(), "client-5");
}

// GetStatus carries the latest records of the history (100 by default, at
// most 10000) and counts them all, so that a long run's status stays small.
TEST_F(CoordinatorServiceTest, GetStatusCarriesTheLatestHistoryAndCountsIt) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 1;
  o.clients_per_round = 1;
  o.max_rounds = 105;
  o.convergence_threshold = -std::numeric_limits<double>::infinity();
  Start(o);
  auto client = Join();
  const std::vector<float> zero(NumParameters());
  for (int round = 1; round <= 105; ++round) {
    ASSERT_EQ(NextTask(*client).task.type(), v1::TASK_TYPE_TRAIN) << round;
    ASSERT_TRUE(client->PushUpdate(Header(round, 10, 1.0), zero).ok());
  }
  ASSERT_TRUE(server_->controller().AwaitHistory(105, kWait));
  auto stub = v1::Coordinator::NewStub(channel_);
  auto get = [&](int history_size, v1::GetStatusResponse* reply) {
    grpc::ClientContext context;
    v1::GetStatusRequest request;
    request.set_history_size(history_size);
    return stub->GetStatus(&context, request, reply);
  };
  v1::GetStatusResponse reply;
  ASSERT_TRUE(get(0, &reply).ok());
  EXPECT_EQ(reply.history_total(), 105);
  ASSERT_EQ(reply.history_size(), 100);
  EXPECT_EQ(reply.history(0).round(), 6);  // oldest first
  EXPECT_EQ(reply.history(99).round(), 105);
  ASSERT_TRUE(get(3, &reply).ok());
  ASSERT_EQ(reply.history_size(), 3);
  EXPECT_EQ(reply.history(0).round(), 103);
  EXPECT_EQ(reply.history(2).round(), 105);
  ASSERT_TRUE(get(50000, &reply).ok());
  EXPECT_EQ(reply.history_size(), 105);
  EXPECT_EQ(reply.history(0).round(), 1);
  grpc::Status bad = get(-1, &reply);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("history_size -1"));
}

TEST_F(CoordinatorServiceTest, GetStatusListsRecordsClientsOnlyWhenAsked) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 2;
  o.clients_per_round = 2;
  o.tolerance = 0;
  Start(o);
  auto clients = JoinAll(2);
  const std::vector<float> zero(NumParameters());
  ASSERT_EQ(NextTask(*clients[0]).task.type(), v1::TASK_TYPE_TRAIN);
  ASSERT_EQ(NextTask(*clients[1]).task.type(), v1::TASK_TYPE_TRAIN);
  ASSERT_TRUE(clients[1]->PushUpdate(Header(1, 10, 1.0), zero).ok());
  auto stub = v1::Coordinator::NewStub(channel_);
  auto get = [&](bool client_ids) {
    grpc::ClientContext context;
    v1::GetStatusRequest request;
    request.set_client_ids(client_ids);
    v1::GetStatusResponse reply;
    EXPECT_TRUE(stub->GetStatus(&context, request, &reply).ok());
    return reply;
  };
  // The open round: both selected, one answered.
  v1::GetStatusResponse reply = get(false);
  ASSERT_TRUE(reply.has_current_round());
  EXPECT_EQ(reply.current_round().selected(), 2);
  EXPECT_EQ(reply.current_round().responded(), 1);
  EXPECT_EQ(reply.current_round().selected_clients_size(), 0);
  EXPECT_EQ(reply.current_round().accepted_clients_size(), 0);
  reply = get(true);
  EXPECT_EQ(reply.current_round().selected_clients_size(), 2);
  EXPECT_THAT(reply.current_round().accepted_clients(),
              ::testing::ElementsAre(clients[1]->client_id()));

  ASSERT_TRUE(clients[0]->PushUpdate(Header(1, 10, 1.0), zero).ok());
  ASSERT_TRUE(server_->controller().AwaitHistory(1, kWait));
  reply = get(false);
  ASSERT_GE(reply.history_size(), 1);
  EXPECT_EQ(reply.history(0).responded(), 2);
  EXPECT_EQ(reply.history(0).selected_clients_size(), 0);
  EXPECT_EQ(reply.history(0).accepted_clients_size(), 0);
  reply = get(true);
  ASSERT_GE(reply.history_size(), 1);
  EXPECT_THAT(
      reply.history(0).accepted_clients(),
      ::testing::ElementsAre(clients[1]->client_id(), clients[0]->client_id()));
  EXPECT_THAT(reply.history(0).selected_clients(),
              ::testing::UnorderedElementsAre(clients[0]->client_id(),
                                              clients[1]->client_id()));
}

TEST_F(CoordinatorServiceTest, TokensAreCheckedOnEveryCall) {
  CoordinatorOptions o = SmallRun();
  o.join_token = "s3cret";
  Start(o);
  {
    CoordinatorClient stranger(channel_);
    EXPECT_EQ(stranger.Join(v1::JoinRequest()).status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  auto alice = Join("s3cret");
  auto bob = Join("s3cret");
  const std::string alice_token = alice->session_token();
  v1::HeartbeatRequest beat;
  ASSERT_TRUE(alice->Heartbeat(beat).ok());

  alice->set_session_token("");
  EXPECT_EQ(alice->Heartbeat(beat).status().code(),
            absl::StatusCode::kUnauthenticated);
  alice->set_session_token("not-a-token");
  EXPECT_EQ(alice->Heartbeat(beat).status().code(),
            absl::StatusCode::kUnauthenticated);
  alice->set_session_token(bob->session_token());
  EXPECT_EQ(alice->Heartbeat(beat).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(alice->RequestUpdate(absl::Milliseconds(1)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(
      alice->PushUpdate(Header(1, 1, 1), std::vector<float>(NumParameters()))
          .status()
          .code(),
      absl::StatusCode::kPermissionDenied);
  v1::ReportEvalRequest report;
  EXPECT_EQ(alice->ReportEval(report).code(),
            absl::StatusCode::kPermissionDenied);
  alice->set_session_token(alice_token);
  alice->set_client_id("client-999");
  EXPECT_EQ(alice->Heartbeat(beat).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorServiceTest, ModelLargerThanFourMegabytesRoundTrips) {
  CoordinatorOptions o = SmallRun();
  o.model = "mnist_cnn";  // 1,199,882 floats: 4.8 MB, over gRPC's default 4 MB
                          // message
  o.min_clients = 1;
  o.clients_per_round = 1;
  o.max_rounds = 1;
  Start(o);
  auto client = Join();
  ASSERT_EQ(client->spec().num_parameters, 1199882);
  auto task = NextTask(*client);
  ASSERT_EQ(task.task.type(), v1::TASK_TYPE_TRAIN);
  EXPECT_EQ(task.task.payload_bytes(), 1199882 * 4);
  std::vector<float> initial(1199882);
  InitializeParameters(*LookupModel("mnist_cnn"), o.seed,
                       absl::MakeSpan(initial));
  ASSERT_EQ(task.weights, initial);
  std::vector<float> delta(initial.size());
  for (size_t i = 0; i < delta.size(); ++i)
    delta[i] = static_cast<float>(i % 97) * 1e-3f;
  ASSERT_TRUE(client->PushUpdate(Header(1, 10, 1.0), delta).ok());
  const std::vector<float> after = Global();
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ(after[i],
              static_cast<float>(double{initial[i]} + double{delta[i]}))
        << i;
  }
}

TEST_F(CoordinatorServiceTest, ShutdownAnswersPendingPollsUnavailable) {
  Start(SmallRun());
  auto client = Join();
  absl::StatusOr<CoordinatorClient::ReceivedTask> result;
  std::thread poller(
      [&] { result = client->RequestUpdate(absl::Seconds(20)); });
  ASSERT_TRUE(server_->controller().AwaitPendingPolls(1, kWait));
  server_->Shutdown(absl::Seconds(5));
  poller.join();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable)
      << result.status();
}

TEST_F(CoordinatorServiceTest, HealthIsServing) {
  Start(SmallRun());
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("fedlearn.v1.Coordinator");
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(stub->Check(&context, request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// --- Any model --------------------------------------------------------------

// A model of the user's own, from a safetensors file: a 0-d tensor, a
// 1-element one, one larger than a chunk and 200 in all. It travels through
// Join, TRAIN, the pushes and FedAvg exactly.
TEST_F(CoordinatorServiceTest, AFileModelRoundTripsExactly) {
  std::vector<TensorDecl> decls = {{"scalar", {}, Init::kZeros},
                                   {"one", {1}, Init::kZeros},
                                   {"big", {200, 300}, Init::kZeros}};
  for (int i = 0; i < 197; ++i) {
    decls.push_back({absl::StrCat("t", i), {i % 4 + 1, 2}, Init::kZeros});
  }
  absl::StatusOr<ModelSpec> spec = MakeModelSpec("mine", std::move(decls));
  ASSERT_TRUE(spec.ok());
  std::vector<float> initial(spec->num_parameters);
  for (size_t i = 0; i < initial.size(); ++i) {
    initial[i] = static_cast<float>(i % 1000) / 1024.0f - 0.25f;
  }
  testing::ScopedTempDir dir;
  const std::string path = dir.Path("mine.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, *spec, initial).ok());

  CoordinatorOptions options = SmallRun();
  options.model = path;
  options.min_clients = 2;
  options.clients_per_round = 2;
  options.max_rounds = 1;
  Start(options);
  auto a = Join();
  auto b = Join();
  EXPECT_EQ(a->spec().name, "mine");
  ASSERT_EQ(a->spec().tensors.size(), 200u);
  EXPECT_TRUE(a->spec().tensors[0].shape.empty());
  EXPECT_EQ(a->spec().tensors[2].num_elements, 60000);  // 240 KB: 4 chunks
  auto task_a = NextTask(*a);
  auto task_b = NextTask(*b);
  EXPECT_EQ(task_a.weights, initial);
  EXPECT_EQ(task_b.weights, initial);
  // Deltas of 1/8 (n = 100) and -1/4 (n = 300): the mean is -1/8 exactly.
  ASSERT_TRUE(a->PushUpdate(Header(1, 100, 1.0),
                            std::vector<float>(initial.size(), 0.125f))
                  .ok());
  ASSERT_TRUE(b->PushUpdate(Header(1, 300, 1.0),
                            std::vector<float>(initial.size(), -0.25f))
                  .ok());
  std::vector<float> want = initial;
  for (float& w : want) w -= 0.15625f;  // (12.5 - 75) / 400
  EXPECT_EQ(Global(), want);
}

TEST_F(CoordinatorServiceTest, AMalformedModelFileIsAStartupError) {
  testing::ScopedTempDir dir;
  const std::string path = dir.Path("broken.safetensors");
  testing::WriteBytes(path, std::string("\x05\0\0\0\0\0\0\0{\"a\":", 13));
  CoordinatorOptions options = SmallRun();
  options.model = path;
  auto server = CoordinatorServer::Start(options, "127.0.0.1:0");
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(),
              HasSubstr(absl::StrCat("--model: ", path)));
  options.model = "resnet50";
  EXPECT_THAT(
      CoordinatorServer::Start(options, "127.0.0.1:0").status().message(),
      HasSubstr("PATH.safetensors"));
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

// The model after applying `delta` (the same in every parameter) at `scale`,
// computed as the coordinator must: in float, parameter by parameter.
std::vector<float> Applied(std::vector<float> weights, double scale,
                           float delta) {
  const float step = static_cast<float>(scale);
  for (float& w : weights) w += step * delta;
  return weights;
}

TEST_F(CoordinatorServiceTest, AsyncAppliesEachUpdateScaledByItsStaleness) {
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

TEST_F(CoordinatorServiceTest, AsyncRejectsStaleRepeatedAndAbandonedUpdates) {
  CoordinatorOptions options = AsyncRun();
  options.min_clients = 3;
  options.max_rounds = 10;
  options.max_staleness = 1;
  Start(options);
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

TEST_F(CoordinatorServiceTest, AsyncStopCutsOffUpdatesStillUploading) {
  CoordinatorOptions options = AsyncRun();
  options.max_rounds = 1;
  Start(options);
  auto a = Join();
  auto b = Join();
  ASSERT_EQ(NextTask(*a).task.round(), 1);
  ASSERT_EQ(NextTask(*b).task.round(), 1);
  const std::vector<float> delta(NumParameters(), 0.1f);

  // b's push is admitted (the go-ahead arrives) and then stalls mid-update.
  auto stub = v1::Coordinator::NewStub(channel_);
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + b->session_token());
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  v1::PushGradientResponse response;
  auto writer = stub->PushGradient(&context, &response);
  const auto messages = Messages(*b, Header(1, 100, 1.0), delta);
  ASSERT_TRUE(writer->Write(messages[0]));
  writer->WaitForInitialMetadata();
  ASSERT_TRUE(writer->Write(messages[1]));

  // a's update is the last one training takes: b's upload is cut off at once
  // rather than received in full and then turned away.
  ASSERT_TRUE(a->PushUpdate(Header(1, 100, 1.0), delta).ok());
  EXPECT_EQ(Status().phase(), v1::PHASE_EVALUATING);
  const grpc::Status cut = writer->Finish();
  EXPECT_EQ(cut.error_code(), grpc::StatusCode::CANCELLED)
      << cut.error_message();
  EXPECT_EQ(Status().history_size(), 1);
}

TEST_F(CoordinatorServiceTest, AsyncStopsWhenAWindowsLossStopsImproving) {
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

// One request on the reflection stream, as grpcurl makes it, through the
// generic stub: the request and response are raw protobuf bytes, so this needs
// no reflection.proto.
std::string Reflect(const std::shared_ptr<grpc::Channel>& channel,
                    const std::string& request) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  auto call = stub.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  auto step = [&](int id) {
    return cq.Next(&tag, &ok) && ok && tag == reinterpret_cast<void*>(id);
  };
  call->StartCall(reinterpret_cast<void*>(1));
  if (!step(1)) return "start failed";
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  if (!step(2)) return "write failed";
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(3));
  if (!step(3)) return "read failed";
  call->WritesDone(reinterpret_cast<void*>(4));
  step(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  std::vector<grpc::Slice> slices;
  if (!in.Dump(&slices).ok()) return "dump failed";
  std::string response;
  for (const grpc::Slice& s : slices) {
    response.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return response;
}

TEST_F(CoordinatorServiceTest, ReflectionDescribesTheServices) {
  Start(SmallRun());
  // ServerReflectionRequest{list_services: ""}: field 7, length-delimited,
  // empty.
  const std::string services = Reflect(channel_, std::string("\x3a\x00", 2));
  EXPECT_THAT(services, HasSubstr("fedlearn.v1.Coordinator"));
  EXPECT_THAT(services, HasSubstr("grpc.health.v1.Health"));
  // ServerReflectionRequest{file_containing_symbol: "fedlearn.v1.Coordinator"}:
  // field 4.
  const std::string symbol = "fedlearn.v1.Coordinator";
  const std::string file =
      Reflect(channel_,
              std::string("\x22") + static_cast<char>(symbol.size()) + symbol);
  EXPECT_THAT(file, HasSubstr("fedlearn/v1/coordinator.proto"));
  EXPECT_THAT(file, HasSubstr("PushGradient"));
}

}  // namespace
}  // namespace fedlearn
